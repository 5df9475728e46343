// The console's shared helpers (window.lw), loaded before every page's script.
// DOM is built with textContent only: whatever a room name or a message holds is shown as
// text. State-changing calls send the page's CSRF token; the session is the HttpOnly
// cookie, which this script never sees.
"use strict";

(function () {
  const csrfMeta = document.querySelector('meta[name="csrf-token"]');
  const csrf = csrfMeta ? csrfMeta.getAttribute("content") : "";
  const errorBox = document.getElementById("lw-error");
  // Attributes that take a URL: only same-origin paths and fragments are accepted.
  const URL_ATTRIBUTES = new Set(["href", "src", "action", "formaction"]);

  function showError(text) {
    if (!errorBox) {
      return;
    }
    errorBox.textContent = text;
    errorBox.hidden = text === "";
  }

  // Call the admin API: JSON in and out, same-origin credentials, the CSRF token on
  // anything but GET. A 401 means the session ended: back to the sign-in form.
  async function api(path, options) {
    const opts = options || {};
    const method = (opts.method || "GET").toUpperCase();
    const headers = { Accept: "application/json" };
    const init = { method: method, credentials: "same-origin", headers: headers };
    if (method !== "GET" && method !== "HEAD") {
      headers["X-CSRF-Token"] = csrf;
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(opts.body === undefined ? {} : opts.body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (exc) {
      showError("The server cannot be reached: " + exc.message);
      throw exc;
    }
    if (response.status === 401) {
      window.location.assign("/console/");
      throw new Error("signed out");
    }
    let answer = null;
    try {
      answer = await response.json();
    } catch (exc) {
      answer = null;
    }
    if (!response.ok || answer === null) {
      const why = answer && answer.error ? answer.error : response.status + " " + response.statusText;
      showError(method + " " + path + ": " + why);
      throw new Error(why);
    }
    showError("");
    return answer;
  }

  // Build an element: attrs set properties and attributes (functions under on* become
  // listeners), children are nodes or text (never parsed as markup).
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) {
        continue;
      }
      if (name.startsWith("on")) {
        if (typeof value !== "function") {
          throw new TypeError("lw.el: " + name + " takes a function");
        }
        node.addEventListener(name.slice(2).toLowerCase(), value);
      } else if (name === "class") {
        node.className = String(value);
      } else if (name === "dataset") {
        Object.assign(node.dataset, value);
      } else if (URL_ATTRIBUTES.has(name)) {
        const url = String(value);
        if (!(url.startsWith("/") || url.startsWith("#")) || url.startsWith("//")) {
          throw new TypeError("lw.el: " + name + " must be a same-origin path");
        }
        node.setAttribute(name, url);
      } else {
        node.setAttribute(name, value === true ? "" : String(value));
      }
    }
    append(node, children);
    return node;
  }

  function append(node, children) {
    for (const child of children) {
      if (child === null || child === undefined || child === false) {
        continue;
      }
      if (Array.isArray(child)) {
        append(node, child);
      } else if (child instanceof Node) {
        node.appendChild(child);
      } else {
        node.appendChild(document.createTextNode(String(child)));
      }
    }
  }

  // A table in a horizontally scrolling box: columns are {key, title, format?}; format
  // returns text or a node for the cell.
  function table(columns, rows, options) {
    const opts = options || {};
    const head = el("tr", {}, columns.map((c) => el("th", { scope: "col" }, c.title)));
    const body = rows.map((row) =>
      el(
        "tr",
        {},
        // data-label: on a phone each row is a card, each cell headed by its column's title.
        columns.map((c) => el("td", { "data-label": c.title }, c.format ? c.format(row) : row[c.key]))
      )
    );
    if (rows.length === 0) {
      body.push(el("tr", {}, el("td", { colspan: columns.length, class: "muted" }, opts.empty || "Nothing yet.")));
    }
    return el("div", { class: "table-wrap" }, el("table", {}, el("thead", {}, head), el("tbody", {}, body)));
  }

  // Live countdowns: one shared timer updates every element still in the page.
  const countdowns = new Map();
  let ticker = null;

  function formatSeconds(seconds) {
    const s = Math.max(0, Math.ceil(seconds));
    if (s < 60) {
      return s + " s";
    }
    const minutes = Math.floor(s / 60);
    if (minutes < 60) {
      return minutes + " min " + String(s % 60).padStart(2, "0") + " s";
    }
    return Math.floor(minutes / 60) + " h " + String(minutes % 60).padStart(2, "0") + " min";
  }

  function tick() {
    const now = Date.now();
    for (const [node, entry] of countdowns) {
      if (!node.isConnected) {
        countdowns.delete(node);
        continue;
      }
      const left = (entry.deadline - now) / 1000;
      node.textContent = formatSeconds(left);
      if (left <= 0) {
        countdowns.delete(node);
        if (entry.onEnd) {
          entry.onEnd();
        }
      }
    }
    if (countdowns.size === 0 && ticker !== null) {
      clearInterval(ticker);
      ticker = null;
    }
  }

  function countdown(node, seconds, onEnd) {
    countdowns.set(node, { deadline: Date.now() + seconds * 1000, onEnd: onEnd });
    node.textContent = formatSeconds(seconds);
    if (ticker === null) {
      ticker = setInterval(tick, 1000);
    }
    return node;
  }

  // Server-sent events with reconnection: EventSource retries network errors itself but
  // gives up on an HTTP error, so a closed source is reopened with doubling delays.
  function sse(path, onEvent, options) {
    const names = (options && options.events) || [];
    let source = null;
    let delay = 1000;
    let stopped = false;
    function handle(event) {
      let data = event.data;
      try {
        data = JSON.parse(event.data);
      } catch (exc) {
        // not JSON: handed over as text
      }
      onEvent(data, event);
    }
    function open() {
      source = new EventSource(path);
      source.onopen = () => {
        delay = 1000;
        showError("");
      };
      source.onmessage = handle;
      for (const name of names) {
        source.addEventListener(name, handle);
      }
      source.onerror = () => {
        if (source.readyState === EventSource.CLOSED && !stopped) {
          showError("The live feed was interrupted; reconnecting…");
          setTimeout(open, delay);
          delay = Math.min(delay * 2, 30000);
        }
      };
    }
    open();
    return {
      close() {
        stopped = true;
        source.close();
      },
    };
  }

  // A uPlot chart sized to its element: opts are {title, series: [{label}], data:
  // [xs, ...ys], height}; returns {update(data), destroy()}.
  function chart(node, opts) {
    const options = {
      title: opts.title,
      width: Math.max(node.clientWidth, 280),
      height: opts.height || 240,
      series: [{}].concat(opts.series || []),
      axes: opts.axes,
      scales: opts.scales,
    };
    const plot = new uPlot(options, opts.data, node);
    const resize = new ResizeObserver(() => {
      plot.setSize({ width: Math.max(node.clientWidth, 280), height: options.height });
    });
    resize.observe(node);
    return {
      update(data) {
        plot.setData(data);
      },
      destroy() {
        resize.disconnect();
        plot.destroy();
      },
    };
  }

  // Call fn now and again `ms` after each call ends (never two at once); paused while
  // the tab is hidden. Returns a function that stops it.
  function every(ms, fn) {
    let timer = null;
    let stopped = false;
    async function run() {
      timer = null;
      if (stopped) {
        return;
      }
      if (!document.hidden) {
        try {
          await fn();
        } catch (exc) {
          // lw.api has shown the error; the next round tries again
        }
      }
      if (!stopped) {
        timer = setTimeout(run, ms);
      }
    }
    run();
    return () => {
      stopped = true;
      if (timer !== null) {
        clearTimeout(timer);
      }
    };
  }

  // A wall-clock time from the API (seconds since the epoch, or ISO text) in local time.
  function time(value) {
    const date = typeof value === "number" ? new Date(value * 1000) : new Date(String(value));
    return Number.isNaN(date.getTime()) ? String(value) : date.toLocaleString();
  }

  // Replace node's children with build()'s (a node or an array of them) unless `data` is
  // what it shows already, so a poll that brings nothing new keeps the focus, the
  // selection and live countdowns.
  const shownData = new WeakMap();
  function show(node, data, build) {
    const key = JSON.stringify(data);
    if (shownData.get(node) === key) {
      return false;
    }
    shownData.set(node, key);
    node.replaceChildren(...[].concat(build()));
    return true;
  }

  // Write a page's filters into its address without a reload, so a filtered view can be
  // bookmarked (filters only: a token never goes into a URL). Empty values are left out;
  // returns the URLSearchParams written.
  function keepQuery(values) {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(values)) {
      if (value !== "" && value !== null && value !== undefined) {
        params.set(name, String(value));
      }
    }
    const search = params.toString();
    window.history.replaceState(null, "", window.location.pathname + (search ? "?" + search : ""));
    return params;
  }

  // Each guard's colour in the charts, fixed by its name (not by the order guards first
  // appear in), so a chart drawn again with another guard added keeps every colour.
  const GUARD_COLORS = {
    admission: "#8e44ad",
    bot_loop: "#b3261e",
    bot_turns: "#d35400",
    silence: "#16a085",
    admin: "#2c3e50",
    agent_dispatch: "#7f8c8d",
    self_filter: "#27ae60",
    dedupe: "#5b3cc4",
  };
  const OTHER_COLORS = ["#c0392b", "#1f77b4", "#9c6b00", "#006d77", "#6a3d9a", "#b15928"];
  function guardColor(name) {
    if (Object.prototype.hasOwnProperty.call(GUARD_COLORS, name)) {
      return GUARD_COLORS[name];
    }
    let hash = 0;
    for (const char of String(name)) {
      hash = (hash * 31 + char.codePointAt(0)) >>> 0;
    }
    return OTHER_COLORS[hash % OTHER_COLORS.length];
  }

  window.lw = Object.freeze({
    guardColor: guardColor,
    api: api,
    el: el,
    table: table,
    countdown: countdown,
    formatSeconds: formatSeconds,
    sse: sse,
    chart: chart,
    every: every,
    time: time,
    show: show,
    keepQuery: keepQuery,
    error: showError,
    page: document.getElementById("page"),
  });
})();
