// The Audit page: the audit trail's two logs, newest first, from GET /admin/audit:
// what admins did (chat, admin API, console) and every other attempt (a non-admin's or
// a bot's refused command, a console request refused for its CSRF token, a failed
// sign-in, a person's own /new in a DM), the newest 200 of each. Refreshed every 10 s.
// The server writes control and invisible characters as escapes (`\n`, `\u202e`); cells
// are text nodes (lw.el), never markup.
"use strict";

(function () {
  const COLUMNS = [
    { key: "at", title: "When", format: (e) => (e.iso ? lw.time(e.iso) : lw.time(e.at)) },
    { key: "platform", title: "Via" },
    { key: "room", title: "Room" },
    { key: "user", title: "Who", format: (e) => (e.user_name ? e.user_id + " (" + e.user_name + ")" : e.user_id) },
    { key: "command", title: "Command", format: (e) => lw.el("code", {}, e.command) },
    {
      key: "allowed",
      title: "Allowed",
      format: (e) => lw.el("span", { class: e.allowed ? "ok" : "refused" }, e.allowed ? "allowed" : "refused"),
    },
    { key: "outcome", title: "Outcome" },
  ];
  const LOGS = [
    { kind: "admin", title: "Admin actions", empty: "No admin action yet." },
    { kind: "others", title: "Other attempts", empty: "No other attempt yet." },
  ];

  // Before the structured answer (`entries`) a server sends its text: one line each.
  function lines(result) {
    const items = String(result).split("\n").filter((line) => line !== "");
    return lw.el("ul", { class: "lines" }, items.map((line) => lw.el("li", {}, line)));
  }

  async function section(log) {
    const answer = await lw.api("/admin/audit?limit=200&kind=" + log.kind);
    const shown = Array.isArray(answer.entries)
      ? lw.table(COLUMNS, answer.entries, { empty: log.empty })
      : lines(answer.result);
    return lw.el("section", { class: "audit-" + log.kind }, lw.el("h2", {}, log.title), shown);
  }

  async function load() {
    const sections = await Promise.all(LOGS.map(section));
    lw.page.replaceChildren(lw.el("h1", {}, "Audit"), ...sections);
  }

  lw.every(10000, load);
})();
