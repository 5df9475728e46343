"""The admin surface: `/loop` in chat, the admin API and the console, over one service.

- `service` (AdminService: what every admin action does) and `views` (how rooms, pairs,
  audit entries and circuits are shown);
- `access`: who may call (bearer token, console session, CSRF) and how a request is read;
- the routes, each builder taking the app's `AdminAccess`: `api` (status, policy, reset,
  pause, resume, set, audit, circuits), `rooms`, `activity`, `calls`, `spend`;
- `console/`: the operator console's pages, sessions and sign-in.
"""
