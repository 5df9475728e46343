// The Rules page: each uniqueness rule (GET /admin/rules) with its fields, filters, limit,
// window, action and mode, and what it would have done to the calls of the last 7 days.
// The preview replays those calls on the server, so the page asks once a minute.
"use strict";

(function () {
  const filters = (r) => {
    const pairs = Object.entries(r.filters).map(([name, value]) => name + " = " + value);
    return pairs.length === 0 ? lw.el("span", { class: "muted" }, "every call") : pairs.join(", ");
  };
  const counted = (n, what) => n.toLocaleString() + " " + what + (n === 1 ? "" : "s");
  const preview = (r) => {
    const p = r.preview;
    return lw.el(
      "span",
      {},
      lw.el("strong", { class: p.would_refuse > 0 ? "refused" : "" }, p.would_refuse.toLocaleString()),
      " of " + counted(p.applies, "call") + " it applies to, in " + counted(p.groups, "group") +
        " (" + counted(p.calls, "call") + " logged)"
    );
  };

  const COLUMNS = [
    { key: "name", title: "Rule", format: (r) => lw.el("code", {}, r.name) },
    { key: "fields", title: "Unique by", format: (r) => r.fields.join(", ") },
    { key: "filters", title: "Applies to", format: filters },
    { key: "max_calls", title: "Max calls" },
    { key: "window", title: "Window", format: (r) => lw.formatSeconds(r.window) },
    { key: "action", title: "Action" },
    {
      key: "mode",
      title: "Mode",
      format: (r) =>
        r.mode === "shadow" ? lw.el("span", { class: "muted" }, "shadow (would refuse)") : r.mode,
    },
    { key: "preview", title: "Would have refused, 7 days", format: preview },
  ];

  async function load() {
    const answer = await lw.api("/admin/rules");
    lw.page.replaceChildren(
      lw.el("h1", {}, "Rules"),
      lw.table(COLUMNS, answer.rules, { empty: answer.result })
    );
  }

  lw.every(60000, load);
})();
