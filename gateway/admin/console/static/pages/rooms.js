// The Rooms page: every room seen (GET /admin/rooms, polled every 2 s), its effective policy
// with the runtime overrides marked, its pause, live bot pairs and bot turns, the times
// counting down live; Reset, Pause, Resume and Forget call the admin API, then refresh the
// room. A card's body is rebuilt only when what it shows changed, so the countdowns tick
// on between polls and the buttons stay where they are.
"use strict";

(function () {
  const POLL_MS = 2000;
  const SPEND_MS = 10000;
  // A deadline that moves by about this many seconds between two polls rebuilds the card.
  const DEADLINE_SLACK = 3;
  const SHOWN_REFUSALS = 5;
  const RESET_WARNING = "Bots may talk to each other again at once.";
  const FORGET_WARNING = "The bots lose what was said there.";
  const PAUSES = [
    { label: "Pause 10 min", seconds: 600 },
    { label: "Pause 1 h", seconds: 3600 },
    { label: "Pause until resumed", seconds: null },
  ];

  const cards = new Map(); // room key -> {node, head, body, policy, signature}
  const spend = new Map(); // room key -> {at, groups}
  const list = lw.el("div", { class: "rooms" });
  const none = lw.el(
    "p",
    { class: "muted", hidden: true },
    "No room seen yet: a room is listed once a message reaches a hosted bot there, " +
      "two bots pair up, or an admin acts on it."
  );

  function nowSeconds() {
    return Date.now() / 1000;
  }

  // A wall-clock instant from seconds left (or ago), coarse enough to compare two polls.
  function deadline(left) {
    return left === null ? null : Math.round((nowSeconds() + left) / DEADLINE_SLACK);
  }

  function signature(room) {
    return JSON.stringify(
      Object.assign({}, room, {
        paused_left: deadline(room.paused_left),
        pairs: room.pairs.map((p) => Object.assign({}, p, { cooldown_left: deadline(p.cooldown_left) })),
        recent_refusals: room.recent_refusals.map((r) => Object.assign({}, r, { age: deadline(-r.age) })),
        spend: (spend.get(room.room) || {}).groups,
      })
    );
  }

  function text(value) {
    if (value === null || value === undefined) {
      return "none";
    }
    if (Array.isArray(value)) {
      return value.length === 0 ? "none" : value.join(", ");
    }
    if (typeof value === "object") {
      return JSON.stringify(value);
    }
    return String(value);
  }

  function badge(label, kind, title) {
    return lw.el("span", { class: "badge " + kind, title: title }, label);
  }

  // The policy, a line per section (`bot_loop: max_events_per_window 6 …`), each field a
  // runtime override set marked with a badge.
  function policy(room) {
    const overrides = room.overrides;
    function field(path, value) {
      const overridden = Object.prototype.hasOwnProperty.call(overrides, path);
      return lw.el(
        "span",
        { class: overridden ? "field overridden" : "field" },
        lw.el("span", { class: "muted" }, path.slice(path.indexOf(".") + 1)),
        " ",
        text(value),
        overridden ? overrideBadge() : null
      );
    }
    const rows = Object.entries(room.policy).map(([section, settings]) => {
      const fields =
        settings !== null && typeof settings === "object" && !Array.isArray(settings)
          ? Object.entries(settings).map(([name, value]) => field(section + "." + name, value))
          : [lw.el("span", { class: "field muted" }, settings === null ? "none" : text(settings))];
      return [lw.el("dt", {}, section), lw.el("dd", {}, fields)];
    });
    return lw.el("dl", { class: "policy" }, rows);
  }

  function overrideBadge() {
    return badge("override", "override", "set at runtime (/loop set or the admin API)");
  }

  // What a countdown does when it reaches 0: read the room again (the pair or pause ended).
  function refreshSoon(room) {
    return () => {
      refreshRoom(room.room).catch(() => {});
    };
  }

  function pairs(room) {
    const columns = [
      { key: "names", title: "Pair", format: (p) => p.names[0] + " ↔ " + p.names[1] },
      {
        key: "count",
        title: "Count / budget",
        format: (p) => lw.el("span", { class: "count" }, p.count + " / " + p.budget),
      },
      { key: "window_seconds", title: "Window", format: (p) => lw.formatSeconds(p.window_seconds) },
      {
        key: "cooldown_left",
        title: "Cooldown left",
        format: (p) =>
          p.cooldown_left > 0
            ? lw.countdown(lw.el("span", { class: "cooldown" }), p.cooldown_left, refreshSoon(room))
            : lw.el("span", { class: "muted" }, "none"),
      },
    ];
    return lw.table(columns, room.pairs, { empty: "No live bot pairs." });
  }

  function spendLine(room) {
    const known = spend.get(room.room);
    if (!known || known.groups.length === 0) {
      return null;
    }
    return lw.el(
      "ul",
      { class: "lines spend" },
      known.groups.map((g) => {
        const parts = [g.group + ": $" + g.spent_usd.toFixed(4)];
        if (g.limit_usd !== null) {
          parts.push(" of $" + g.limit_usd.toFixed(2));
        }
        parts.push(", " + g.spent_tokens + " tokens");
        if (g.limit_tokens !== null) {
          parts.push(" of " + g.limit_tokens);
        }
        if (g.percent !== null) {
          parts.push(" (" + Math.round(g.percent) + "%)");
        }
        parts.push(", until " + lw.time(g.ends_at));
        return lw.el("li", {}, parts.join(""));
      })
    );
  }

  function body(room) {
    const facts = [
      lw.el(
        "li",
        {},
        "Bot turns in a row: ",
        lw.el("span", { class: "turns" }, room.bot_turns + " / " + room.max_bot_turns)
      ),
    ];
    const overrides = Object.entries(room.overrides);
    if (overrides.length > 0) {
      facts.push(
        lw.el(
          "li",
          { class: "overrides" },
          "Runtime overrides: ",
          overrides.map(([path, value]) =>
            lw.el("span", { class: "field overridden" }, path + " " + text(value), overrideBadge())
          )
        )
      );
    }
    for (const [guard, count] of Object.entries(room.shadow)) {
      facts.push(lw.el("li", {}, badge("shadow", "shadow"), " " + guard + " would have refused " + count));
    }
    const refusals = room.recent_refusals.slice(0, SHOWN_REFUSALS).map((r) => {
      const detail = r.detail ? " (" + r.detail + ")" : "";
      return lw.el("li", {}, lw.time(nowSeconds() - r.age) + " " + r.stage + " " + r.code + detail);
    });
    return [
      pairs(room),
      lw.el("ul", { class: "facts" }, facts),
      spendLine(room),
      refusals.length > 0
        ? [lw.el("h3", {}, "Recent refusals"), lw.el("ul", { class: "lines" }, refusals)]
        : null,
    ];
  }

  function pauseState(room) {
    if (!room.paused) {
      return lw.el("span", { class: "pause muted" }, "running");
    }
    if (room.paused_left === null) {
      return lw.el("span", { class: "pause refused" }, "paused until resumed");
    }
    return lw.el(
      "span",
      { class: "pause refused" },
      "paused for ",
      lw.countdown(lw.el("span", { class: "pause-left" }), room.paused_left, refreshSoon(room))
    );
  }

  async function act(room, status, path, body, question) {
    if (question && !window.confirm(question)) {
      return;
    }
    status.textContent = "…";
    try {
      const answer = await lw.api(path, { method: "POST", body: body });
      status.textContent = answer.result;
    } catch (exc) {
      status.textContent = "failed: " + exc.message;
    }
    spend.delete(room);
    await refreshRoom(room).catch(() => {});
  }

  function actions(room, status) {
    const key = { room: room };
    const button = (label, path, body, question) =>
      lw.el("button", { type: "button", onclick: () => act(room, status, path, body, question) }, label);
    return lw.el(
      "div",
      { class: "actions" },
      button("Reset", "/admin/reset", key, "Reset the bot pairs of " + room + "? " + RESET_WARNING),
      PAUSES.map((p) =>
        button(p.label, "/admin/pause", p.seconds === null ? key : { room: room, seconds: p.seconds })
      ),
      button("Resume", "/admin/resume", key),
      button("Forget", "/admin/forget", key, "Forget the conversation of " + room + "? " + FORGET_WARNING)
    );
  }

  function card(room) {
    let entry = cards.get(room.room);
    if (!entry) {
      const status = lw.el("p", { class: "muted action-status", role: "status" });
      const head = lw.el("div", { class: "room-state" });
      entry = {
        head: head,
        body: lw.el("div", { class: "room-body" }),
        policy: lw.el("div"),
        signature: null,
        node: null,
      };
      // Built once: the policy stays open or closed as the operator left it.
      entry.node = lw.el(
        "section",
        { class: "room-card", dataset: { room: room.room } },
        lw.el("h2", {}, room.room),
        head,
        entry.body,
        lw.el("details", {}, lw.el("summary", {}, "Effective policy"), entry.policy),
        actions(room.room, status),
        status
      );
      cards.set(room.room, entry);
    }
    const seen = signature(room);
    if (seen !== entry.signature) {
      entry.signature = seen;
      const head = [pauseState(room)];
      if (room.degraded) {
        head.push(badge("state backend unavailable: some values are missing", "degraded"));
      }
      entry.head.replaceChildren(...head);
      entry.body.replaceChildren(...body(room).flat().filter((node) => node !== null));
      entry.policy.replaceChildren(policy(room));
    }
    return entry.node;
  }

  // The spend of the rooms that have a `policy.spend`, read at most every SPEND_MS.
  async function readSpend(rooms) {
    const stale = (r) => nowSeconds() - ((spend.get(r.room) || {}).at || 0) > SPEND_MS / 1000;
    const due = rooms.filter((r) => r.policy.spend && stale(r));
    await Promise.all(
      due.map(async (r) => {
        try {
          const answer = await lw.api("/admin/spend?room=" + encodeURIComponent(r.room));
          spend.set(r.room, { at: nowSeconds(), groups: answer.groups || [] });
        } catch (exc) {
          // lw.api has shown the error; the room is shown without its spend
        }
      })
    );
  }

  async function refreshRoom(room) {
    const answer = await lw.api("/admin/rooms?room=" + encodeURIComponent(room));
    await readSpend(answer.rooms);
    for (const each of answer.rooms) {
      card(each);
    }
  }

  async function refreshAll() {
    const answer = await lw.api("/admin/rooms");
    await readSpend(answer.rooms);
    const shown = answer.rooms.map(card);
    const keys = new Set(answer.rooms.map((r) => r.room));
    for (const [key, entry] of cards) {
      if (!keys.has(key)) {
        entry.node.remove();
        cards.delete(key);
      }
    }
    // Moved only when the order changed: moving a node would drop a button's focus.
    const current = Array.from(list.children);
    if (current.length !== shown.length || current.some((node, i) => node !== shown[i])) {
      list.replaceChildren(...shown);
    }
    none.hidden = shown.length > 0;
  }

  lw.page.replaceChildren(
    lw.el("h1", {}, "Rooms"),
    lw.el("p", { class: "muted" }, "Every room seen, newest first; refreshed every 2 s."),
    none,
    list
  );
  lw.every(POLL_MS, refreshAll);
})();
