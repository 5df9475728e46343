// The Spend page (the proxy's): each budget group's spend this period against its limit
// (GET /admin/spend?by=&period=, the filters kept in the page's address), a form that
// raises a budget's limit until its period ends (POST /admin/spend/limit), and a Reset
// per group (POST /admin/spend/reset). Polled every 5 s.
"use strict";

(function () {
  // gateway.config.proxy.PerField and the budget periods.
  const FIELDS = ["agent", "session", "customer", "user", "feature", "model"];
  const PERIODS = ["day", "week", "month"];
  // The alert thresholds (50% and 80%) colour the bar.
  const LOW = 50;
  const HIGH = 80;

  // Errors are shown by lw.api; the next poll shows the spend as it is.
  const quietly = (promise) => promise.catch(() => {});

  const address = new URLSearchParams(window.location.search);
  const notice = lw.el("p", { class: "notice", role: "status" });

  function choice(name, title, values) {
    const select = lw.el(
      "select",
      { id: "spend-" + name, name: name, onchange: () => quietly(load()) },
      lw.el("option", { value: "" }, "any"),
      values.map((v) => lw.el("option", { value: v, selected: address.get(name) === v }, v))
    );
    return { select: select, label: lw.el("label", { for: "spend-" + name }, title, select) };
  }

  const by = choice("by", "Grouped by", FIELDS);
  const period = choice("period", "Period", PERIODS);

  const budget = lw.el("select", { id: "limit-budget", name: "budget", required: true });
  const usd = lw.el("input", {
    id: "limit-usd",
    name: "limit_usd",
    type: "number",
    min: 0,
    step: "any",
    inputmode: "decimal",
  });
  const tokens = lw.el("input", {
    id: "limit-tokens",
    name: "limit_tokens",
    type: "number",
    min: 0,
    step: 1,
    inputmode: "numeric",
  });
  const raiseForm = lw.el(
    "form",
    {
      class: "controls filters",
      id: "limit-form",
      onsubmit: (event) => {
        event.preventDefault();
        quietly(raise());
      },
    },
    lw.el("label", { for: "limit-budget" }, "Budget", budget),
    lw.el("label", { for: "limit-usd" }, "Limit ($)", usd),
    lw.el("label", { for: "limit-tokens" }, "Limit (tokens)", tokens),
    lw.el("div", { class: "actions" }, lw.el("button", { type: "submit" }, "Raise limit"))
  );
  const list = lw.el("div", { id: "spend-groups" }, lw.el("p", { class: "muted" }, "Loading…"));

  async function raise() {
    const body = { budget: budget.value };
    if (usd.value !== "") {
      body.limit_usd = Number(usd.value);
    }
    if (tokens.value !== "") {
      body.limit_tokens = Number(tokens.value);
    }
    const answer = await lw.api("/admin/spend/limit", { method: "POST", body: body });
    notice.textContent = answer.result;
    usd.value = "";
    tokens.value = "";
    await load();
  }

  function pick(row) {
    budget.value = row.budget;
    usd.focus();
  }

  async function reset(row) {
    if (!window.confirm("Reset the spend of " + row.budget + " for " + row.group + " this period?")) {
      return;
    }
    const answer = await lw.api("/admin/spend/reset", {
      method: "POST",
      body: { budget: row.budget, group: row.group },
    });
    notice.textContent = answer.result;
    await load();
  }

  function share(row) {
    const full = row.percent === null;
    const value = full ? 100 : Math.min(row.percent, 100);
    const bar = lw.el("meter", { min: 0, max: 100, low: LOW, high: HIGH, optimum: 0, value: value });
    const text = full ? "no allowance" : row.percent.toFixed(1) + "%";
    return lw.el("span", { class: "share" }, bar, " " + text);
  }

  const COLUMNS = [
    { key: "budget", title: "Budget", format: (r) => lw.el("code", {}, r.budget) },
    { key: "group", title: "Group", format: (r) => lw.el("code", {}, r.group) },
    { key: "spent", title: "Spent" },
    { key: "held", title: "Held (in flight)" },
    { key: "limit", title: "Limit" },
    { key: "percent", title: "Share", format: share },
    { key: "ends", title: "Period ends" },
    {
      key: "actions",
      title: "",
      format: (r) =>
        lw.el(
          "span",
          { class: "actions" },
          lw.el("button", { type: "button", onclick: () => pick(r) }, "Raise limit"),
          lw.el("button", { type: "button", onclick: () => quietly(reset(r)) }, "Reset group")
        ),
    },
  ];

  async function load() {
    const filters = lw.keepQuery({ by: by.select.value, period: period.select.value });
    const search = filters.toString();
    const answer = await lw.api("/admin/spend" + (search ? "?" + search : ""));
    lw.show(budget, answer.budgets, () => {
      const chosen = budget.value;
      return answer.budgets.map((b) =>
        lw.el(
          "option",
          { value: b.name, selected: b.name === chosen },
          b.name + " (per " + (b.per.join(", ") || "all calls") + ", " + b.period + ")"
        )
      );
    });
    lw.show(list, answer.groups, () =>
      lw.table(COLUMNS, answer.groups, { empty: answer.result })
    );
  }

  lw.page.replaceChildren(
    lw.el("h1", {}, "Spend"),
    lw.el(
      "form",
      { class: "controls filters", onsubmit: (event) => event.preventDefault() },
      by.label,
      period.label
    ),
    notice,
    list,
    lw.el("h2", { class: "section" }, "Raise a limit for this period"),
    raiseForm
  );
  lw.every(5000, load);
})();
