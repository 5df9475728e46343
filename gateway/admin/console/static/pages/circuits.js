// The Circuits page: the LLM-call circuits and rule groups paused now (GET /admin/circuits),
// each with its pause counting down and a Reopen button (POST /admin/circuits/reopen).
// Polled every 2 s; the table is rebuilt only when a pause starts, ends or changes.
"use strict";

(function () {
  const notice = lw.el("p", { class: "notice", role: "status" });
  const list = lw.el("div", {}, lw.el("p", { class: "muted" }, "Loading…"));

  function pauseLeft(circuit) {
    if (circuit.paused_left === null) {
      return lw.el("span", { class: "muted" }, "until reopened");
    }
    return lw.countdown(lw.el("span", { class: "countdown" }), circuit.paused_left, load);
  }

  async function reopen(circuit) {
    if (!window.confirm("Reopen " + circuit.circuit + "? Its calls are forwarded again.")) {
      return;
    }
    const answer = await lw.api("/admin/circuits/reopen", {
      method: "POST",
      body: { circuit: circuit.circuit },
    });
    notice.textContent = answer.result;
    await load();
  }

  const COLUMNS = [
    { key: "circuit", title: "Circuit", format: (c) => lw.el("code", {}, c.circuit) },
    { key: "rule", title: "Paused by", format: (c) => (c.group ? "rule " + c.rule : "repeat guard") },
    { key: "reason", title: "Reason" },
    { key: "count", title: "Count" },
    { key: "paused_left", title: "Pause left", format: pauseLeft },
    {
      key: "reopen",
      title: "",
      // A failed reopen is shown by lw.api; the next poll shows what is paused.
      format: (c) => lw.el("button", { type: "button", onclick: () => reopen(c).catch(() => {}) }, "Reopen"),
    },
  ];

  async function load() {
    const answer = await lw.api("/admin/circuits");
    const circuits = answer.circuits;
    // The pause left moves on every poll; the countdown shows it, so it is not a change.
    const shown = circuits.map((c) => [c.circuit, c.rule, c.reason, c.count, c.paused_left === null]);
    lw.show(list, shown, () =>
      lw.table(COLUMNS, circuits, { empty: "No circuit or rule group is paused." })
    );
  }

  lw.page.replaceChildren(lw.el("h1", {}, "Circuits"), notice, list);
  lw.every(2000, load);
})();
