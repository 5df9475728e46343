// The Activity page: the gateway's decisions as they happen (GET /admin/activity/stream,
// server-sent events), newest on top, and charts of messages in, replies out and refusals
// by guard (GET /admin/activity/series) per minute over the last hour or per hour over the
// last day. A room filter narrows both. Every field, the message excerpt included, is
// shown as text.
"use strict";

(function () {
  const SHOWN = 200;
  const KEPT = 1000;
  const CHART_MS = 10000;
  const CHART_HEIGHT = 200;
  const NO_POINTS = { show: false };
  const SPANS = { hour: "Last hour, per minute", day: "Last day, per hour" };

  let room = "";
  let span = "hour";
  let newest = -1;
  let stream = null;
  let kept = []; // newest first, at most KEPT

  const roomSelect = lw.el(
    "select",
    { id: "room-filter", onchange: () => chooseRoom(roomSelect.value) },
    lw.el("option", { value: "" }, "All rooms")
  );
  const routine = lw.el("input", { type: "checkbox", id: "show-routine", onchange: () => renderFeed() });
  const feed = lw.el("ol", { class: "feed", "aria-live": "polite" });
  const empty = lw.el("p", { class: "muted" }, "Waiting for the gateway's first decision…");
  const summary = lw.el("p", { class: "muted chart-summary" });
  const messagesBox = lw.el("div", { class: "chart" });
  const refusalsBox = lw.el("div", { class: "chart", hidden: true });
  const noRefusals = lw.el("p", { class: "muted", hidden: true }, "No refusals in this span.");
  const spanButtons = Object.entries(SPANS).map(([name, label]) =>
    lw.el(
      "button",
      {
        type: "button",
        dataset: { span: name },
        "aria-pressed": String(name === span),
        onclick: () => chooseSpan(name),
      },
      label
    )
  );
  let messagesChart = null;
  let refusalsChart = null;
  let guards = ""; // the refusal chart's series, as drawn
  let asked = 0; // the newest chart request: an older answer arriving later is dropped

  function addRoom(key) {
    if (!key || Array.from(roomSelect.options).some((option) => option.value === key)) {
      return;
    }
    roomSelect.appendChild(lw.el("option", { value: key }, key));
  }

  function shown(event) {
    // Every hosted bot a message does not address refuses it: shown only on request.
    return routine.checked || !event.routine;
  }

  function item(event) {
    if (event.gap) {
      return lw.el(
        "li",
        { class: "event gap" },
        "Events " + event.after + "–" + event.before + " were skipped while the feed was flooded " +
          "(GET /admin/activity?since=" + event.after + " lists them)."
      );
    }
    const what = [event.kind, event.stage, event.code].filter((part) => part).join(" ");
    return lw.el(
      "li",
      { class: "event kind-" + event.kind, dataset: { id: String(event.id) } },
      lw.el("span", { class: "when muted" }, lw.time(event.at)),
      lw.el("span", { class: "room" }, event.room),
      lw.el("span", { class: "bot" }, event.bot),
      lw.el("span", { class: "what" }, what),
      event.detail ? lw.el("span", { class: "detail" }, event.detail) : null,
      lw.el(
        "span",
        { class: "said" },
        lw.el("span", { class: "sender muted" }, event.sender + ": "),
        lw.el("q", { class: "excerpt" }, event.excerpt)
      )
    );
  }

  function renderFeed() {
    const visible = kept.filter(shown).slice(0, SHOWN);
    feed.replaceChildren(...visible.map(item));
    empty.hidden = visible.length > 0;
  }

  function receive(data, event) {
    if (event.type === "gap") {
      kept.unshift({ gap: true, after: data.after, before: data.before });
    } else {
      if (typeof data !== "object" || data === null || data.id <= newest) {
        return; // a reconnected stream starts again with events already shown
      }
      newest = data.id;
      addRoom(data.room);
      kept.unshift(data);
    }
    kept = kept.slice(0, KEPT);
    const entry = kept[0];
    if (entry.gap || shown(entry)) {
      feed.prepend(item(entry));
      while (feed.children.length > SHOWN) {
        feed.lastChild.remove();
      }
      empty.hidden = true;
    }
  }

  function openStream() {
    if (stream !== null) {
      stream.close();
    }
    const query = room ? "?room=" + encodeURIComponent(room) : "";
    stream = lw.sse("/admin/activity/stream" + query, receive, { events: ["gap"] });
  }

  function chooseRoom(key) {
    room = key;
    newest = -1;
    kept = [];
    renderFeed();
    openStream();
    loadCharts().catch(() => {});
  }

  function chooseSpan(name) {
    span = name;
    for (const button of spanButtons) {
      button.setAttribute("aria-pressed", String(button.dataset.span === span));
    }
    loadCharts().catch(() => {});
  }

  function drawRefusals(xs, buckets) {
    const names = Array.from(new Set(buckets.flatMap((b) => Object.keys(b.refusals)))).sort();
    noRefusals.hidden = names.length > 0;
    refusalsBox.hidden = names.length === 0;
    const data = [xs].concat(names.map((name) => buckets.map((b) => b.refusals[name] || 0)));
    if (refusalsChart !== null && names.join(",") === guards) {
      refusalsChart.update(data);
      return;
    }
    if (refusalsChart !== null) {
      refusalsChart.destroy();
      refusalsChart = null;
    }
    guards = names.join(",");
    if (names.length > 0) {
      refusalsChart = lw.chart(refusalsBox, {
        title: "Refusals by guard",
        series: names.map((name) => ({
          label: name,
          stroke: lw.guardColor(name),
          width: 1.5,
          points: NO_POINTS,
        })),
        data: data,
        height: CHART_HEIGHT,
      });
    }
  }

  async function loadCharts() {
    const query = "?span=" + span + (room ? "&room=" + encodeURIComponent(room) : "");
    const ask = ++asked;
    const answer = await lw.api("/admin/activity/series" + query);
    if (ask !== asked) {
      return;
    }
    summary.textContent = answer.result;
    const buckets = answer.buckets;
    const xs = buckets.map((b) => b.t);
    const data = [xs, buckets.map((b) => b.in), buckets.map((b) => b.out)];
    if (messagesChart === null) {
      messagesChart = lw.chart(messagesBox, {
        title: "Messages in, replies out",
        series: [
          { label: "messages in", stroke: "#1f5fbf", width: 1.5, points: NO_POINTS },
          { label: "replies out", stroke: "#1e7a3c", width: 1.5, points: NO_POINTS },
        ],
        data: data,
        height: CHART_HEIGHT,
      });
    } else {
      messagesChart.update(data);
    }
    drawRefusals(xs, buckets);
  }

  async function loadRooms() {
    const answer = await lw.api("/admin/rooms");
    for (const each of answer.rooms) {
      addRoom(each.room);
    }
  }

  lw.page.replaceChildren(
    lw.el("h1", {}, "Activity"),
    lw.el(
      "div",
      { class: "controls" },
      lw.el("label", { for: "room-filter" }, "Room "),
      roomSelect,
      lw.el("label", { class: "check" }, routine, " Show routine refusals (not addressed)")
    ),
    lw.el(
      "section",
      { class: "charts" },
      lw.el("div", { class: "actions" }, spanButtons),
      summary,
      lw.el("div", { class: "chart-grid" }, messagesBox, refusalsBox, noRefusals)
    ),
    lw.el("h2", {}, "Decisions, newest first"),
    empty,
    feed
  );
  loadRooms().catch(() => {});
  openStream();
  lw.every(CHART_MS, loadCharts);
})();
