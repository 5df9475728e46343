"""What the console's sign-in page says when it refuses (kept apart from the templates)."""

WRONG_TOKEN = "That is not the admin token."
BAD_CODE = "This sign-in link is not valid: it was used already, or it has expired."
TOO_MANY = (
    "Too many sign-in attempts from your address: try again in {seconds} s. On the server's "
    "host, `loopwarden console-link --config FILE` prints a sign-in link that works now."
)
TOO_LARGE = "The form is larger than {limit:,} bytes."
UNREADABLE = "The form could not be read: send one token field, UTF-8 encoded."
CROSS_SITE = "This form was sent from another site: open the console at its own address to sign in."
