// The Calls page: the request log (GET /admin/calls, 50 at a time, newest first) with its
// filters kept in the page's address (a filtered view can be bookmarked), the filter's
// totals, cost per hour over the last day (GET /admin/calls/series?span=day) and the
// filtered log as CSV (GET /admin/calls.csv: a plain link, the session cookie signs it).
"use strict";

(function () {
  // gateway.calls.store.OUTCOMES, in its order (a browser test compares the two).
  const OUTCOMES = [
    "forwarded",
    "loop_detected",
    "loop_paused",
    "duplicate_call",
    "budget_exceeded",
    "state_unavailable",
    "upstream_error",
  ];
  const TEXT_FILTERS = [
    ["agent", "Agent"],
    ["session", "Session"],
    ["customer", "Customer"],
    ["model", "Model"],
  ];
  const PAGE_SIZE = 50;
  const MAX_TEXT = 256;

  const money = (usd) =>
    "$" + usd.toLocaleString(undefined, { minimumFractionDigits: 2, maximumFractionDigits: 6 });
  const count = (n) => n.toLocaleString();

  // since/until are seconds since the epoch in the address and the API, local time in
  // the form's datetime-local fields.
  function toLocalInput(seconds) {
    if (!/^[0-9]{1,12}$/.test(seconds || "")) {
      return "";
    }
    const d = new Date(Number(seconds) * 1000);
    const two = (n) => String(n).padStart(2, "0");
    return (
      d.getFullYear() + "-" + two(d.getMonth() + 1) + "-" + two(d.getDate()) +
      "T" + two(d.getHours()) + ":" + two(d.getMinutes())
    );
  }

  function fromLocalInput(value) {
    const ms = value === "" ? NaN : new Date(value).getTime();
    return Number.isNaN(ms) ? "" : String(Math.floor(ms / 1000));
  }

  const address = new URLSearchParams(window.location.search);
  const inputs = {};
  for (const [name] of TEXT_FILTERS) {
    inputs[name] = lw.el("input", {
      id: "filter-" + name,
      name: name,
      type: "text",
      maxlength: MAX_TEXT,
      autocomplete: "off",
      value: address.get(name) || "",
    });
  }
  inputs.outcome = lw.el(
    "select",
    { id: "filter-outcome", name: "outcome" },
    lw.el("option", { value: "" }, "any"),
    OUTCOMES.map((o) => lw.el("option", { value: o, selected: address.get("outcome") === o }, o))
  );
  for (const name of ["since", "until"]) {
    inputs[name] = lw.el("input", {
      id: "filter-" + name,
      name: name,
      type: "datetime-local",
      value: toLocalInput(address.get(name)),
    });
  }
  const titles = TEXT_FILTERS.concat([["outcome", "Outcome"], ["since", "Since"], ["until", "Until"]]);
  const fields = titles.map(([name, title]) =>
    lw.el("label", { for: "filter-" + name }, title, inputs[name])
  );

  const csv = lw.el(
    "a",
    { href: "/admin/calls.csv", download: "calls.csv", id: "calls-csv" },
    "Download CSV"
  );
  const form = lw.el(
    "form",
    {
      class: "controls filters",
      id: "calls-filters",
      onsubmit: (event) => {
        event.preventDefault();
        apply();
      },
    },
    fields,
    lw.el(
      "div",
      { class: "actions" },
      lw.el("button", { type: "submit" }, "Apply"),
      lw.el("button", { type: "button", onclick: clear }, "Clear"),
      csv
    )
  );
  const totals = lw.el("dl", { class: "totals", id: "calls-totals" });
  const chartBox = lw.el("div", { class: "chart", id: "calls-chart" });
  const log = lw.el("div", { id: "calls-log", class: "log" });
  const more = lw.el(
    "button",
    { type: "button", id: "calls-more", hidden: true, onclick: loadMore },
    "Load more"
  );

  let chart = null;
  let query = new URLSearchParams();
  let entries = [];
  let cursor = null;
  let generation = 0;

  function current() {
    const values = {};
    for (const [name] of TEXT_FILTERS) {
      values[name] = inputs[name].value.trim();
    }
    values.outcome = inputs.outcome.value;
    values.since = fromLocalInput(inputs.since.value);
    values.until = fromLocalInput(inputs.until.value);
    return values;
  }

  function clear() {
    for (const input of Object.values(inputs)) {
      input.value = "";
    }
    apply();
  }

  const COLUMNS = [
    { key: "at", title: "When", format: (c) => lw.time(c.at) },
    { key: "agent", title: "Agent" },
    { key: "session", title: "Session", format: (c) => lw.el("code", {}, c.session) },
    { key: "customer", title: "Customer", format: (c) => c.fields.customer || "" },
    { key: "model", title: "Model" },
    {
      key: "outcome",
      title: "Outcome",
      format: (c) => lw.el("span", { class: c.refused ? "refused" : "ok" }, c.outcome),
    },
    { key: "status", title: "Status" },
    {
      key: "tokens",
      title: "Tokens in / out",
      format: (c) => (c.estimated ? "≈ " : "") + count(c.input_tokens) + " / " + count(c.output_tokens),
    },
    {
      key: "cost",
      title: "Cost",
      format: (c) =>
        c.priced
          ? (c.estimated ? "≈ " : "") + money(c.cost)
          : lw.el("span", { class: "muted" }, "unpriced"),
    },
    { key: "rule", title: "Rule", format: (c) => c.rule || "" },
    {
      key: "duration_ms",
      title: "ms",
      format: (c) => (c.duration_ms === null ? "" : count(Math.round(c.duration_ms))),
    },
  ];

  function showTotals(t) {
    const items = [
      ["Calls", count(t.calls) + " (" + count(t.refused) + " refused)"],
      ["Input tokens", count(t.input_tokens)],
      ["Output tokens", count(t.output_tokens)],
      ["Cost", money(t.cost)],
      ["Cost saved by refusals", money(t.cost_saved)],
    ];
    if (t.unpriced > 0) {
      items.push(["Unpriced calls", count(t.unpriced)]);
    }
    totals.replaceChildren(
      ...items.map(([name, value]) => lw.el("div", {}, lw.el("dt", {}, name), lw.el("dd", {}, value)))
    );
  }

  function showLog() {
    log.replaceChildren(lw.table(COLUMNS, entries, { empty: "No call matches these filters." }));
    more.hidden = cursor === null;
  }

  async function loadPage(run) {
    const params = new URLSearchParams(query);
    params.set("limit", String(PAGE_SIZE));
    if (cursor !== null) {
      params.set("cursor", cursor);
    }
    const answer = await lw.api("/admin/calls?" + params.toString());
    if (run !== generation) {
      return;
    }
    entries = entries.concat(answer.calls);
    cursor = answer.next_cursor;
    showTotals(answer.totals);
    showLog();
  }

  async function loadChart(run) {
    // The series takes the filters and an end (`until`), not a start: the day before it.
    const params = new URLSearchParams(query);
    params.delete("since");
    params.set("span", "day");
    const answer = await lw.api("/admin/calls/series?" + params.toString());
    if (run !== generation) {
      return;
    }
    const b = answer.buckets;
    const data = [b.map((x) => x.t), b.map((x) => x.cost), b.map((x) => x.saved)];
    if (chart === null) {
      chart = lw.chart(chartBox, {
        title: "Cost per hour, last 24 h ($)",
        series: [
          { label: "cost", stroke: "#1f5fbf", width: 1.5, fill: "rgba(31,95,191,.08)" },
          { label: "saved by refusals", stroke: "#1e7a3c", width: 1.5 },
        ],
        scales: { y: { range: (u, min, max) => [0, Math.max(0.01, max * 1.1)] } },
        data: data,
      });
    } else {
      chart.update(data);
    }
  }

  async function apply() {
    query = lw.keepQuery(current());
    const search = query.toString();
    csv.setAttribute("href", "/admin/calls.csv" + (search ? "?" + search : ""));
    generation += 1;
    const run = generation;
    entries = [];
    cursor = null;
    more.hidden = true;
    await Promise.all([loadPage(run), loadChart(run)]).catch(() => {
      // lw.api has shown what went wrong (a 400 names the filter)
    });
  }

  // One page at a time: a second click while one loads would fetch the same cursor.
  function loadMore() {
    more.disabled = true;
    loadPage(generation)
      .catch(() => {
        // lw.api has shown what went wrong; the button stays for another try
      })
      .finally(() => {
        more.disabled = false;
      });
  }

  lw.page.replaceChildren(
    lw.el("h1", {}, "Calls"),
    form,
    totals,
    chartBox,
    log,
    lw.el("p", {}, more)
  );
  apply();
})();
