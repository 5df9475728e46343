// The room page: one websocket, a live message list, reconnecting when the socket drops.
"use strict";
(() => {
  const room = new URLSearchParams(location.search).get("room") || "lobby";
  const list = document.getElementById("messages");
  const scroller = document.getElementById("scroller");
  const statusLine = document.getElementById("status");
  const typingLine = document.getElementById("typing");
  const nameBox = document.getElementById("name");
  const textBox = document.getElementById("text");
  const actions = document.getElementById("actions");
  const typing = new Map();
  let socket = null;
  let attempt = 0;

  document.getElementById("room-name").textContent = room;

  function setStatus(state, text) {
    statusLine.dataset.state = state;
    statusLine.textContent = text;
  }

  function send(event) {
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify(event));
      return true;
    }
    return false;
  }

  function join() {
    send({ type: "join", name: nameBox.value.trim() || "alice", room });
  }

  function clock(ts) {
    return new Date(ts * 1000).toLocaleTimeString();
  }

  function line(className, parts) {
    const item = document.createElement("li");
    item.className = className;
    for (const [tag, cls, text] of parts) {
      const part = document.createElement(tag);
      part.className = cls;
      part.textContent = text; // never innerHTML: chat text is untrusted
      item.append(part);
    }
    return item;
  }

  function renderMessage(m) {
    const parts = [["time", "ts", clock(m.ts)], ["span", "sender", m.sender_name]];
    if (m.system) parts.push(["span", "badge", "system"]);
    else if (m.is_bot) parts.push(["span", "badge", "bot"]);
    parts.push(["span", "text", m.text]);
    // The gateway's own answers (commands) and a bot's cooldown notice stand out.
    const guard = m.is_bot && /^Loop guard\b/.test(m.text) ? " guard" : "";
    const kind = m.system ? "message system" : m.is_bot ? `message bot${guard}` : "message human";
    const item = line(kind, parts);
    item.dataset.id = String(m.id);
    return item;
  }

  function renderEntry(entry) {
    return entry.type === "notice" ? renderNotice(entry) : renderMessage(entry);
  }

  function showActions(offered) {
    actions.replaceChildren(
      ...(offered || []).map((action) => {
        const button = document.createElement("button");
        button.type = "button";
        button.textContent = action.label;
        button.addEventListener("click", () => send({ type: "say", text: action.say }));
        return button;
      })
    );
  }

  function renderNotice(n) {
    const level = n.level === "error" ? "notice error" : "notice";
    return line(level, [["span", "text", n.text]]);
  }

  function append(item) {
    const atBottom = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 40;
    list.append(item);
    if (atBottom) scroller.scrollTop = scroller.scrollHeight;
  }

  function showTyping() {
    const names = [...typing.keys()];
    typingLine.textContent = names.length ? `${names.join(", ")} typing…` : "";
  }

  function startTyping(name) {
    clearTimeout(typing.get(name));
    typing.set(name, setTimeout(() => stopTyping(name), 5000));
    showTyping();
  }

  function stopTyping(name) {
    clearTimeout(typing.get(name));
    typing.delete(name);
    showTyping();
  }

  function handle(event) {
    switch (event.type) {
      case "joined":
        setStatus("joined", `connected as ${event.name}`);
        showActions(event.actions);
        break;
      case "history":
        list.replaceChildren(...event.messages.map(renderEntry));
        scroller.scrollTop = scroller.scrollHeight;
        break;
      case "message":
        stopTyping(event.sender_name);
        append(renderMessage(event));
        break;
      case "notice":
        append(renderNotice(event));
        break;
      case "typing":
        startTyping(event.sender_name);
        break;
    }
  }

  function connect() {
    const url = new URL("/room/ws", location.href);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    socket = new WebSocket(url);
    socket.onopen = () => {
      attempt = 0;
      setStatus("open", "connected");
      join();
    };
    socket.onmessage = (message) => handle(JSON.parse(message.data));
    socket.onclose = () => {
      const delay = Math.min(5000, 500 * 2 ** attempt++);
      setStatus("closed", `disconnected; retrying in ${Math.round(delay / 1000)} s…`);
      setTimeout(connect, delay);
    };
  }

  document.getElementById("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = textBox.value.trim();
    if (text && send({ type: "say", text })) textBox.value = "";
  });
  nameBox.addEventListener("change", join);

  connect();
})();
