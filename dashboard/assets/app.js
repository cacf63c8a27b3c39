// The registry dashboard. It keeps one Server-Sent Events stream of
// /api/v1/watch (regctl watch -o json, one line per event) and applies
// each line to a map of instances: the first snapshot fills it, every
// reset replaces it, puts and deletes change it. Nothing here polls for
// instances. Status (leader, members, compact revision) is fetched when
// the stream (re)connects, after a drain or undrain, and at most every
// 5 s while progress arrives.
//
// The stream is read with fetch, not EventSource, because EventSource
// cannot send an Authorization header: with --auth every call, the
// stream included, carries the token the operator entered (kept in this
// tab's sessionStorage, never in a URL), and the regnode judges it as any
// gRPC caller's (read to see, operate to drain).
"use strict";

(function () {
  const readOnly = document.querySelector('meta[name="registry-read-only"]').content === "true";
  const auth = document.querySelector('meta[name="registry-auth"]').content === "true";
  const instances = new Map(); // "service/id" -> instance (view.Instance JSON)
  let revision = 0;
  let confirmedAt = 0; // Date.now() of the last line received
  let statusAt = 0;
  let renderQueued = false;

  const $ = (id) => document.getElementById(id);
  const el = (tag, attrs, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else e.setAttribute(k, v);
    }
    for (const k of kids) if (k != null) e.append(k);
    return e;
  };
  const badge = (state) => el("span", { class: "badge s-" + state, text: state });

  function age(iso) {
    if (!iso) return "";
    const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    if (s < 60) return s + "s ago";
    if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s ago";
    if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m ago";
    return Math.floor(s / 86400) + "d ago";
  }

  function say(text, isError) {
    const m = $("message");
    m.textContent = text;
    m.classList.toggle("error", !!isError);
    delete m.dataset.stream; // set by connect for its own messages only
  }

  // ---- the token (only with --auth) -----------------------------------

  const tokenKey = "registry-token";
  let token = auth ? sessionStorage.getItem(tokenKey) || "" : "";
  const withToken = (headers) => (token ? Object.assign({ Authorization: "Bearer " + token }, headers) : headers);

  function useToken(t) {
    token = t.trim();
    if (token) sessionStorage.setItem(tokenKey, token); else sessionStorage.removeItem(tokenKey);
    $("token").value = "";
    $("token-state").textContent = token ? "a token is set for this tab" : "no token";
    // Another token may see other services: start over from a snapshot.
    revision = 0;
    lastId = "";
    instances.clear();
    queueRender();
    reconnect();
    refreshXds();
  }

  // ---- the stream ----------------------------------------------------

  let lastId = ""; // the id of the last complete transaction: where a reconnect resumes
  let stream = null; // the AbortController of the stream being read
  let retryTimer = 0;
  let denied = false; // the last stream was refused for want of a token

  function reconnect() {
    if (stream) stream.abort();
    stream = null;
    clearTimeout(retryTimer);
    connect();
  }

  async function connect() {
    const ctl = new AbortController();
    stream = ctl;
    let url = "/api/v1/watch";
    if (lastId) url += "?from_revision=" + encodeURIComponent(lastId);
    let retryMs = 1000;
    try {
      const r = await fetch(url, { headers: withToken({ Accept: "text/event-stream" }), signal: ctl.signal, cache: "no-store" });
      if (!r.ok) {
        let msg = r.statusText;
        try { msg = (await r.json()).error || msg; } catch (e) { /* not JSON */ }
        if (r.status === 401 || r.status === 403) {
          // No retry until another token is entered: the same one would
          // be refused again.
          denied = true;
          queueRender();
          setConn(false, "needs a token");
          say(auth ? "This regnode checks tokens: enter a read token to see the registry, an operate token to drain (" + msg + ")." : msg, true);
          if (auth) $("token").focus();
          return;
        }
        throw new Error(msg);
      }
      denied = false;
      setConn(true);
      if ($("message").dataset.stream === "error") say("");
      refreshStatus();
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let end;
        while ((end = buf.indexOf("\n\n")) >= 0) {
          const ev = buf.slice(0, end);
          buf = buf.slice(end + 2);
          let data = "";
          let id = null;
          for (const l of ev.split("\n")) {
            if (l.startsWith("data: ")) data += l.slice(6);
            else if (l.startsWith("id: ")) id = l.slice(4);
            else if (l.startsWith("retry: ")) retryMs = Number(l.slice(7)) || retryMs;
          }
          if (data) {
            let line;
            try { line = JSON.parse(data); } catch (e) { line = null; }
            if (line) apply(line);
          }
          if (id !== null) lastId = id;
        }
      }
    } catch (e) {
      if (ctl.signal.aborted) return; // replaced by a newer stream
      say("The watch broke (" + e.message + "); reconnecting.", true);
      $("message").dataset.stream = "error";
    }
    if (stream !== ctl) return;
    // The stream ended (a regnode stopping, a network blip): resume after
    // the last whole transaction, as EventSource would with Last-Event-ID.
    setConn(false);
    stream = null;
    retryTimer = setTimeout(connect, retryMs);
  }

  function setConn(up, why) {
    const c = $("conn");
    c.textContent = up ? "live" : why || "reconnecting…";
    c.className = "conn " + (up ? "conn-up" : "conn-down");
  }

  function apply(line) {
    switch (line.type) {
      case "snapshot":
        instances.clear();
        for (const i of line.instances || []) instances.set(i.service + "/" + i.id, i);
        if (line.new_epoch) say("etcd was restored or replaced: revisions start over (new epoch at " + line.revision + ").");
        break;
      case "put":
        instances.set(line.instance.service + "/" + line.instance.id, line.instance);
        break;
      case "delete":
        instances.delete(line.service + "/" + line.id);
        break;
      case "progress":
        if (Date.now() - statusAt > 5000) refreshStatus();
        break;
    }
    revision = line.revision;
    confirmedAt = Date.now();
    queueRender();
  }

  // statusCalls counts Status calls started and finished (read by the
  // browser tests to know none is in flight).
  const statusCalls = (window.__statusCalls = { started: 0, done: 0 });

  async function refreshStatus() {
    statusAt = Date.now();
    statusCalls.started++;
    try {
      const r = await fetch("/api/v1/status?peers=true", { headers: withToken({ Accept: "application/json" }) });
      const s = await r.json();
      if (!r.ok) throw new Error(s.error || r.statusText);
      renderStatus(s);
    } catch (e) {
      $("leader").textContent = "status unavailable";
    } finally {
      statusCalls.done++;
    }
  }

  // ---- drain and undrain ---------------------------------------------

  // Instances with a drain or undrain in flight. The button is marked
  // aria-disabled rather than disabled: disabling a focused button would
  // throw the keyboard focus back to the page.
  const pending = new Set();

  async function lifecycle(service, id, action, button) {
    const key = service + "/" + id;
    if (pending.has(key)) return;
    pending.add(key);
    button.setAttribute("aria-disabled", "true");
    say((action === "drain" ? "Draining " : "Undraining ") + service + "/" + id + "…");
    try {
      const r = await fetch("/api/v1/services/" + encodeURIComponent(service) + "/instances/" + encodeURIComponent(id) + "/" + action, {
        method: "POST",
        headers: withToken({ "Content-Type": "application/json", Accept: "application/json" }),
        body: action === "drain" ? JSON.stringify({ reason: "from the dashboard" }) : "{}",
      });
      const body = await r.json();
      if (!r.ok) throw new Error(body.error || r.statusText);
      say(service + "/" + id + " is " + body.lifecycle + " (revision " + r.headers.get("X-Registry-Revision") + ").");
      refreshStatus();
    } catch (e) {
      say("Could not " + action + " " + service + "/" + id + ": " + e.message, true);
    } finally {
      pending.delete(key);
      button.removeAttribute("aria-disabled");
      queueRender();
    }
  }

  // ---- rendering -----------------------------------------------------

  function queueRender() {
    if (renderQueued) return;
    renderQueued = true;
    requestAnimationFrame(() => { renderQueued = false; render(); });
  }

  function counts() {
    const by = new Map();
    for (const i of instances.values()) {
      let c = by.get(i.service);
      if (!c) by.set(i.service, c = { service: i.service, total: 0, serving: 0, draining: 0, starting: 0, healthy: 0, degraded: 0, unavailable: 0, unknown: 0 });
      c.total++;
      // As regctl services counts: an unspecified lifecycle is serving,
      // no verdict is unknown.
      if (i.lifecycle === "STARTING") c.starting++; else if (i.lifecycle === "DRAINING") c.draining++; else c.serving++;
      const h = (i.health && i.health.state) || "UNKNOWN";
      if (h === "HEALTHY") c.healthy++; else if (h === "DEGRADED") c.degraded++; else if (h === "UNAVAILABLE") c.unavailable++; else c.unknown++;
    }
    return [...by.values()].sort((a, b) => a.service < b.service ? -1 : a.service > b.service ? 1 : 0);
  }

  function render() {
    // Re-rendering replaces the buttons: keep the keyboard focus where it was.
    const f = document.activeElement;
    const focusKey = f && f.dataset && f.dataset.focus;

    $("revision").textContent = revision || "–";
    const svcs = counts();
    const tbody = $("services").tBodies[0];
    tbody.replaceChildren(...svcs.map((c) => {
      const cells = ["serving", "draining", "starting", "healthy", "degraded", "unavailable", "unknown"].map((k) =>
        el("td", { class: "num" + (c[k] ? "" : " zero"), "data-col": k, text: String(c[k]) }));
      return el("tr", { "data-service": c.service },
        el("th", { scope: "row" }, el("a", { href: "#svc-" + c.service, "data-focus": "link:" + c.service, text: c.service })),
        el("td", { class: "num", "data-col": "total", text: String(c.total) }), ...cells);
    }));
    $("no-services").hidden = svcs.length > 0 || denied; // refused: nothing is known

    const sections = svcs.map((c) => {
      const rows = [...instances.values()].filter((i) => i.service === c.service)
        .sort((a, b) => a.id < b.id ? -1 : a.id > b.id ? 1 : 0).map(row);
      return el("section", { id: "svc-" + c.service, "aria-labelledby": "svc-h-" + c.service },
        el("h2", { id: "svc-h-" + c.service }, c.service + " ", el("span", { class: "count", text: "(" + c.total + ")" })),
        el("table", { class: "grid instances", "data-service": c.service },
          el("thead", {}, el("tr", {}, ...["ID", "Address", "Lifecycle", "Health", "Reason", "Since", "Weight", "Zone", "Version", "Revision", ""].map((h) =>
            el("th", { scope: "col", class: h === "Weight" || h === "Revision" ? "num" : "", text: h })))),
          el("tbody", {}, ...rows)));
    });
    $("instances").replaceChildren(...sections);
    tick();

    if (focusKey) {
      const again = document.querySelector('[data-focus="' + CSS.escape(focusKey) + '"]');
      if (again) again.focus();
    }
  }

  function row(i) {
    const key = i.service + "/" + i.id;
    const h = i.health || {};
    const reasons = [];
    if (h.reason) reasons.push(h.reason);
    if (i.lifecycle_reason) reasons.push((i.lifecycle === "DRAINING" ? "drained: " : "") + i.lifecycle_reason);
    const draining = i.lifecycle === "DRAINING";
    const action = draining ? "undrain" : "drain";
    const b = el("button", {
      // One focus key per instance, so focus stays on its button when
      // Drain turns into Undrain.
      type: "button", class: action, "data-focus": "lifecycle:" + key,
      "aria-label": (draining ? "Undrain " : "Drain ") + key,
      text: draining ? "Undrain" : "Drain",
    });
    if (pending.has(key)) b.setAttribute("aria-disabled", "true");
    if (readOnly) {
      b.disabled = true;
      b.title = "read-only: use regctl " + action + " " + key;
    } else {
      b.addEventListener("click", () => lifecycle(i.service, i.id, action, b));
    }
    const since = i.health && i.health.since ? i.health.since : i.registered_at;
    const latency = h.state && h.state !== "UNKNOWN" && h.latency_ms ? " " + h.latency_ms.toFixed(1) + " ms" : "";
    return el("tr", { "data-key": key },
      el("th", { scope: "row", "data-col": "id", text: i.id }),
      el("td", { "data-col": "address", text: i.address }),
      el("td", { "data-col": "lifecycle" }, badge(i.lifecycle || "UNSPECIFIED")),
      el("td", { "data-col": "health" }, badge(h.state || "UNKNOWN"), latency ? el("span", { class: "muted", text: latency }) : null),
      el("td", { class: "reason", "data-col": "reason", text: reasons.join("; ") }),
      el("td", { "data-col": "since", "data-since": since || "", title: since || "", text: age(since) }),
      el("td", { class: "num", "data-col": "weight", text: String(i.weight || 100) }),
      el("td", { "data-col": "zone", text: i.zone || "–" }),
      el("td", { "data-col": "version", text: i.version || "–" }),
      el("td", { class: "num", "data-col": "mod_revision", title: "the etcd revision of its last change", text: String(i.mod_revision) }),
      el("td", {}, b));
  }

  function renderStatus(s) {
    $("node").textContent = "node " + s.node + " · etcd " + s.etcd_version;
    $("leader").textContent = s.leader || "none";
    $("compact").textContent = String(s.compact_revision);
    $("members").tBodies[0].replaceChildren(...(s.members || []).map((m) =>
      el("tr", { "data-member": m.name },
        el("th", { scope: "row", text: m.name || "(unstarted)" }),
        el("td", { text: m.id }),
        el("td", {}, el("span", { class: "badge " + (m.is_leader ? "s-SERVING" : "s-UNKNOWN"), text: m.is_leader ? "leader" : m.is_learner ? "learner" : "follower" })),
        el("td", { text: (m.client_urls || []).join(", ") }),
        el("td", { text: (m.peer_urls || []).join(", ") }))));
    // Every regnode probes its share of the checked instances.
    $("probing").tBodies[0].replaceChildren(...(s.probing || []).map((p) =>
      el("tr", { "data-prober": p.node },
        el("th", { scope: "row", text: p.node }),
        el("td", { text: p.address }),
        el("td", { text: p.zone || "–" }),
        el("td", { class: "num", "data-col": "owned", text: p.error ? "–" : String(p.owned) }),
        el("td", { class: "num", "data-col": "rate", text: p.error ? "–" : p.probes_per_second.toFixed(1) }),
        el("td", { class: "num", "data-col": "disagreements", text: p.error ? "–" : String(p.disagreements) }),
        el("td", { class: "num", "data-col": "held", text: p.error ? "–" : String(p.held) }),
        el("td", { "data-col": "canary" }, p.error
          ? el("span", { class: "badge s-UNKNOWN", text: "not asked: " + p.error })
          : el("span", { class: "badge " + (p.canary ? "s-UNAVAILABLE" : "s-SERVING"), text: p.canary ? "failing: " + p.canary : "pass" })))));
  }

  // ---- xDS clients ------------------------------------------------------
  //
  // GET /api/v1/xds/clients (every regnode's, or with "every regnode"
  // unchecked this one's): on load, on Refresh, and every 10 s. Not in
  // the watch: xDS streams are each regnode's memory, not etcd.

  const xdsCalls = (window.__xdsCalls = { started: 0, done: 0 });

  async function refreshXds() {
    xdsCalls.started++;
    const url = "/api/v1/xds/clients" + ($("xds-all").checked ? "" : "?local=true");
    try {
      const r = await fetch(url, { headers: withToken({ Accept: "application/json" }), cache: "no-store" });
      const v = await r.json();
      if (!r.ok) throw new Error(v.error || r.statusText);
      renderXds(v);
      $("xds-state").textContent = "as of " + new Date().toLocaleTimeString();
    } catch (e) {
      $("xds-state").textContent = "xDS clients unavailable: " + e.message;
    } finally {
      xdsCalls.done++;
    }
  }

  function renderXds(v) {
    const rows = [];
    const errors = [];
    for (const n of v.nodes || []) {
      if (n.error) errors.push(el("li", { "data-node": n.node, text: "regnode " + n.node + " (" + n.address + "): " + n.error }));
      for (const c of n.clients || []) {
        const svcs = c.services || [];
        const behind = svcs.filter((f) => f.behind).map((f) => f.service + " " + f.acked_revision + "<" + f.revision);
        rows.push(el("tr", { "data-xds": c.node + "/" + c.protocol + "/" + c.stream_id, "data-node-id": c.node_id },
          el("td", { "data-col": "node", text: c.node }),
          el("th", { scope: "row", "data-col": "node_id", text: c.node_id || "–" }),
          el("td", { "data-col": "kind", text: c.kind }),
          el("td", { "data-col": "protocol", text: c.protocol }),
          el("td", { "data-col": "services", text: svcs.map((f) => f.service).join(", ") || "–" }),
          el("td", { "data-col": "acked", text: svcs.map((f) => String(f.acked_revision)).join(", ") || "–" }),
          el("td", { "data-col": "behind" }, behind.length ? el("span", { class: "badge s-DRAINING", text: "behind" }) : null, behind.length ? " " + behind.join(", ") : "no"),
          el("td", { class: "num", "data-col": "nacks", text: String(c.nacks) }),
          el("td", { "data-col": "last_nack", text: c.last_nack || "–" }),
          el("td", { "data-col": "peer", text: c.peer }),
          el("td", { "data-col": "connected", "data-since": c.connected || "", title: c.connected || "", text: age(c.connected) })));
      }
    }
    $("xds").tBodies[0].replaceChildren(...rows);
    $("xds-errors").replaceChildren(...errors);
    $("no-xds").hidden = rows.length > 0;
    $("xds-count").textContent = "(" + rows.length + ")";
  }

  $("xds-refresh").addEventListener("click", refreshXds);
  $("xds-all").addEventListener("change", refreshXds);
  setInterval(refreshXds, 10000);

  // Ages move every second without re-rendering the tables.
  function tick() {
    for (const td of document.querySelectorAll("td[data-since]")) td.textContent = age(td.dataset.since);
    $("confirmed").textContent = confirmedAt ? age(new Date(confirmedAt).toISOString()) : "–";
  }
  setInterval(tick, 1000);

  if (auth) {
    $("token-form").addEventListener("submit", (ev) => { ev.preventDefault(); useToken($("token").value); });
    $("token-forget").addEventListener("click", () => useToken(""));
    $("token-state").textContent = token ? "a token is set for this tab" : "no token";
  }
  render();
  connect();
  refreshXds();
})();
