// The Audit page: the newest 200 admin-command attempts (chat, admin API, console),
// newest first, from GET /admin/audit. Refreshed every 10 s.
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

  // Before the structured answer (`entries`) a server sends its text: one line each.
  function lines(result) {
    const items = String(result).split("\n").filter((line) => line !== "");
    return lw.el("ul", { class: "lines" }, items.map((line) => lw.el("li", {}, line)));
  }

  async function load() {
    const answer = await lw.api("/admin/audit?limit=200");
    const shown = Array.isArray(answer.entries)
      ? lw.table(COLUMNS, answer.entries, { empty: "No audit entries yet." })
      : lines(answer.result);
    lw.page.replaceChildren(lw.el("h1", {}, "Audit"), shown);
  }

  lw.every(10000, load);
})();
