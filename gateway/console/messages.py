"""What the console's sign-in page says when it refuses (kept apart from the templates)."""

WRONG_TOKEN = "That is not the admin token."
BAD_CODE = "This sign-in link is not valid: it was used already, or is older than five minutes."
TOO_MANY = "Too many wrong tokens from your address: try again in {seconds} s."
TOO_LARGE = "The form is larger than {limit:,} bytes."
UNREADABLE = "The form could not be read: send one token field, UTF-8 encoded."
