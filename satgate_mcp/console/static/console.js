// satgate-mcp console: our own small script. Every figure comes from /console/api/; nothing is fetched
// from another origin, and text from the gateway only ever becomes DOM text (never HTML).
"use strict";
(function () {
  const API = "/console/api/";
  const COLORS = ["#1f5fbf", "#b3261e", "#1e7b34", "#9a6200", "#6a3fb5", "#0f7c86", "#7a5a2f"];
  let me = null;
  let timer = null;
  let sessionsQuery = { q: "", offset: 0 };

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "onclick") node.addEventListener("click", value);
      else if (key === "text") node.textContent = value;
      else node.setAttribute(key, value);
    }
    for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
    return node;
  }

  async function get(path) {
    const answer = await fetch(API + path, { credentials: "same-origin" });
    if (answer.status === 401) { location.reload(); throw new Error("logged out"); }
    if (!answer.ok) throw new Error((await answer.json()).error || answer.statusText);
    return answer.json();
  }

  async function post(path, body) {
    const answer = await fetch(API + path, {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": (me && me.csrf) || "" },
      body: JSON.stringify(body),
    });
    const found = await answer.json();
    if (!answer.ok) throw new Error(found.error || answer.statusText);
    return found;
  }

  function say(text, bad) {
    const status = document.getElementById("status");
    status.textContent = text;
    status.className = "status" + (bad ? " bad" : "");
  }

  function table(headers, rows) {
    const head = el("tr", {}, ...headers.map((h) => el("th", { scope: "col" }, h)));
    const body = rows.map((cells) => el("tr", {}, ...cells.map((c) => (c instanceof Node && c.tagName === "TD") ? c : el("td", {}, c))));
    return el("div", { class: "table-wrap" }, el("table", {}, el("thead", {}, head), el("tbody", {}, ...body)));
  }

  function mono(text) { return el("td", { class: "mono" }, text); }
  function off(feature) { return el("p", { class: "off" }, feature.message); }
  function card(title, ...children) { return el("section", { class: "card" }, el("h3", {}, title), ...children); }
  function ago(seconds) {
    if (seconds < 90) return seconds + " s";
    if (seconds < 5400) return Math.round(seconds / 60) + " min";
    return (seconds / 3600).toFixed(1) + " h";
  }

  // A line chart of several series over the same times, as SVG, scaled to its largest value.
  function chart(title, times, series) {
    const W = 600, H = 140, P = 24;
    const names = Object.keys(series);
    const max = Math.max(1e-9, ...names.flatMap((n) => series[n]));
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.setAttribute("class", "chart");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", title);
    const add = (tag, attrs, text) => {
      const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
      for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
      if (text !== undefined) node.textContent = text;
      svg.append(node);
    };
    add("line", { x1: P, y1: H - P, x2: W, y2: H - P, class: "axis" });
    add("line", { x1: P, y1: 4, x2: P, y2: H - P, class: "axis" });
    add("text", { x: 2, y: 12 }, max.toPrecision(2));
    add("text", { x: 2, y: H - P }, "0");
    if (times.length > 1) {
      const t0 = times[0], span = Math.max(1, times[times.length - 1] - t0);
      add("text", { x: P, y: H - 8 }, ago(Math.round(span)) + " ago");
      add("text", { x: W - 30, y: H - 8 }, "now");
      names.forEach((name, i) => {
        const points = series[name].map((v, j) => {
          const x = P + ((times[j] - t0) / span) * (W - P - 4);
          const y = H - P - (v / max) * (H - P - 8);
          return x.toFixed(1) + "," + y.toFixed(1);
        });
        add("polyline", { points: points.join(" "), fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 1.5 });
      });
    } else {
      add("text", { x: W / 2 - 60, y: H / 2 }, "collecting samples");
    }
    const legend = el("div", { class: "legend" }, ...names.map((name, i) =>
      el("span", {}, el("i", {}), name)));
    legend.querySelectorAll("i").forEach((node, i) => { node.style.background = COLORS[i % COLORS.length]; });
    return card(title, svg, legend);
  }

  function counts(object) {
    const entries = Object.entries(object || {});
    if (!entries.length) return el("p", { class: "muted" }, "none");
    return el("ul", {}, ...entries.map(([k, v]) => el("li", {}, `${k}: ${v}`)));
  }

  const views = {
    async overview(main) {
      const data = await get("overview");
      const mine = data.processes[0] || {};
      const total = data.processes.reduce((sum, p) => sum + (p.sessions || 0), 0);
      main.append(el("h2", {}, "Overview"), el("div", { class: "grid" },
        card("Live sessions", el("div", { class: "big" }, total), el("p", { class: "muted" },
          `${data.processes.length} process${data.processes.length === 1 ? "" : "es"}${data.cluster ? " (cluster via Redis)" : " (this one alone)"}`)),
        card("Calls / s (this process)", el("div", { class: "big" }, mine.calls ?? 0),
          el("p", { class: "muted" }, `errors/s ${mine.errors ?? 0}, refusals/s ${mine.refusals ?? 0}`)),
        card("Store", el("div", { class: "big " + (data.store.state === "down" ? "bad" : "ok") }, data.store.state),
          el("p", { class: "muted" }, data.store.kind)),
        card("Sessions by era", counts(mine.eras)), card("Sessions by tenant", counts(mine.tenants))));
      const s = data.series;
      main.append(el("div", { class: "grid" },
        chart("Calls and errors per second, last hour", s.t, { "calls/s": s.calls, "errors/s": s.errors }),
        chart("Refusals per second by reason, last hour", s.t, Object.keys(s.refusals).length ? s.refusals : { "none": s.t.map(() => 0) })));
      main.append(el("h2", {}, "Processes"), table(["Process", "Sessions", "Calls/s", "Errors/s", "Refusals/s", "Upstreams ready", "Store"],
        data.processes.map((p) => [mono(p.process), p.sessions, p.calls, p.errors, p.refusals, `${p.upstreams_ready}/${p.upstreams}`, p.store])));
      const latency = Object.entries(data.latency);
      main.append(el("h2", {}, "Upstream latency (tools/call, last hour)"), latency.length
        ? table(["Upstream", "p50 ms", "p95 ms"], latency.map(([name, q]) => [name, q.p50 ?? "-", q.p95 ?? "-"]))
        : el("p", { class: "muted" }, "No calls yet."));
    },

    async sessions(main) {
      const params = new URLSearchParams({ q: sessionsQuery.q, offset: sessionsQuery.offset, limit: 50 });
      const data = await get("sessions?" + params);
      const search = el("input", { type: "search", id: "session-search", "aria-label": "Search sessions", placeholder: "id, token, tenant, client", value: sessionsQuery.q });
      search.addEventListener("change", () => { sessionsQuery = { q: search.value, offset: 0 }; render(); });
      const prev = el("button", { type: "button", class: "plain", onclick: () => { sessionsQuery.offset = Math.max(0, sessionsQuery.offset - 50); render(); } }, "Previous");
      const next = el("button", { type: "button", class: "plain", onclick: () => { sessionsQuery.offset += 50; render(); } }, "Next");
      prev.disabled = data.offset === 0;
      next.disabled = data.offset + data.items.length >= data.matched;
      main.append(el("h2", {}, `Sessions (${data.total} live on ${data.process})`),
        el("div", { class: "bar" }, el("label", { for: "session-search" }, "Search"), search, prev, next,
          el("span", { class: "muted" }, `${data.matched ? data.offset + 1 : 0}-${data.offset + data.items.length} of ${data.matched}`)),
        table(["Session", "Token", "Tenant", "Client", "Protocol", "Age", "Last call", ""], data.items.map((s) => [
          mono(s.id), s.token_id, s.tenant || "", `${s.client} ${s.client_version}`.trim(), s.protocol, ago(s.age_s), ago(s.idle_s) + " ago",
          el("button", { type: "button", class: "danger", "aria-label": `End session ${s.id}`, onclick: () => act("sessions/end", { id: s.id }, `End session ${s.id}?`) }, "End")])));
    },

    async upstreams(main) {
      const data = await get("upstreams");
      main.append(el("h2", {}, "Upstreams"), table(["Name", "Transport", "State", "Circuit breaker", "Child pid", "Restarts", "Last error"],
        data.upstreams.map((u) => [u.name, u.transport, el("td", { class: u.state === "ready" ? "ok" : "bad" }, u.state),
          u.breaker ? u.breaker.state : "not configured", u.pid ?? "-", u.restarts, u.last_error ? JSON.stringify(u.last_error) : ""])));
      if (!data.breakers.enabled) main.append(off(data.breakers));
      main.append(el("h2", {}, `Tools and pins (SATGATE_TOOL_PINNING=${data.pinning})`));
      const rows = data.upstreams.flatMap((u) => u.tools.map((t) => [u.name, t.name, el("td", { class: t.pin === "pinned" ? "ok" : (t.pin === "off" ? "muted" : "warn") }, t.pin),
        (t.pin === "changed" || t.pin === "new")
          ? el("button", { type: "button", "aria-label": `Approve ${u.name}/${t.name}`, onclick: () => act("upstreams/approve", { target: `${u.name}/${t.name}` }, `Approve the new definition of ${u.name}/${t.name}?`) }, "Approve")
          : ""]));
      main.append(rows.length ? table(["Upstream", "Tool", "Pin", ""], rows) : el("p", { class: "muted" }, "No tools listed yet."));
    },

    async tokens(main) {
      const data = await get("tokens");
      main.append(el("h2", {}, "Budgets: spend against limit"));
      if (data.budgets.problem) main.append(el("p", { class: "error" }, data.budgets.problem));
      main.append(data.budgets.rows.length ? table(["Budget id", "Spent", "Limit", "Remaining", "Tokens with sessions here"],
        data.budgets.rows.map((b) => [b.budget_id, b.spent ?? "-", b.limit ?? "unlimited", b.remaining ?? "unlimited", b.tokens.join(", ")]))
        : el("p", { class: "muted" }, "No budget in use."));
      main.append(el("h2", {}, "Spend limits per window"), data.spend_limits.enabled
        ? (data.spend_limits.rows.length
          ? table(["Token", "Spends from", "Tools", "Field", "Window", "Spent", "Limit", "Resets"], data.spend_limits.rows.map((r) => [r.token_id, r.spender, r.tool, r.field, `${r.window} (${r.tz})`, r.spent ?? "?", r.limit, r.resets_at]))
          : el("p", { class: "muted" }, "No token with a session here carries a spend limit."))
        : off(data.spend_limits));
      main.append(el("h2", {}, `Rate refusals (SATGATE_RATE_LIMIT=${data.rate_limit || "off"})`), counts(data.rate_refusals));
      main.append(el("h2", {}, "Revoke a token"));
      if (!data.revocable) { main.append(el("p", { class: "off" }, "This auth mode has no token ids to revoke.")); return; }
      const input = el("input", { type: "text", id: "revoke-id", name: "token_id", autocomplete: "off" });
      const form = el("form", { class: "bar", id: "revoke-form" }, el("label", { for: "revoke-id" }, "Token id"), input,
        el("button", { type: "submit", class: "danger" }, "Revoke"));
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        const id = input.value.trim();
        if (id) act("tokens/revoke", { token_id: id }, `Revoke every token minted with id ${id}? Its calls are refused within a second.`);
      });
      main.append(form);
    },

    async approvals(main) {
      const data = await get("approvals");
      main.append(el("h2", {}, "Held calls"));
      if (!data.enabled) { main.append(off(data)); return; }
      main.append(data.held.length ? table(["Id", "Token", "Tool", "Arguments", "Why held", "Age", "Expires", ""], data.held.map((h) => [
        mono(h.id), h.token_id, h.tool, mono(h.args), h.reason, ago(h.age_s), h.expires_at,
        el("td", {}, el("button", { type: "button", onclick: () => act("approvals/approve", { id: h.id }, `Approve held call ${h.id}?`) }, "Approve"), " ",
          el("button", { type: "button", class: "danger", onclick: () => act("approvals/deny", { id: h.id }, `Deny held call ${h.id}?`) }, "Deny"))]))
        : el("p", { class: "muted" }, "Nothing is held."));
    },

    async policy(main) {
      const data = await get("policy");
      main.append(el("h2", {}, "Policy rules"));
      if (!data.policy.enabled) main.append(off(data.policy));
      else {
        main.append(el("p", { class: "muted" }, `${data.policy.file}; default ${data.policy.default}`));
        main.append(table(["Rule", "Effect", "Tools", "When", "Decisions"], data.policy.rules.map((r) => [
          r.name, r.effect, (r.tools || ["any"]).join(", "), mono(r.when || "always"),
          Object.entries(r.decisions).map(([effect, n]) => `${effect}: ${n}`).join(", ") || "none"])));
        main.append(el("h2", {}, "Explain one call"), explainForm());
      }
      main.append(el("h2", {}, "Audit trail"));
      if (!data.audit.enabled) main.append(off(data.audit));
      else main.append(el("p", {}, `Chain: ${data.audit.chain.ok ? "verified" : "BROKEN"} ${data.audit.chain.detail || ""}`),
        table(["Line"], data.audit.lines.map((line) => [mono(JSON.stringify(line))])));
    },
  };

  // The same walk as `satgate-mcp policy explain`: which rule decides a call, and why.
  function explainForm() {
    const field = (id, label, attrs) => [el("label", { for: id }, label), el("input", { id, autocomplete: "off", ...attrs })];
    const out = el("pre", { class: "mono", id: "explain-out", "aria-live": "polite" });
    const form = el("form", { class: "bar", id: "explain-form" },
      ...field("explain-token", "Caller's token", { type: "password" }), ...field("explain-tool", "Tool", { type: "text" }),
      ...field("explain-args", "Arguments (JSON)", { type: "text", value: "{}" }), el("button", { type: "submit" }, "Explain"));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      try {
        const args = JSON.parse(document.getElementById("explain-args").value || "{}");
        const found = await post("policy/explain", { token: document.getElementById("explain-token").value,
          tool: document.getElementById("explain-tool").value, args });
        out.textContent = found.report.join("\n");
      } catch (error) {
        out.textContent = "Cannot explain: " + error.message;
      }
    });
    return el("div", {}, form, out);
  }

  async function act(path, body, question) {
    if (!window.confirm(question)) return;
    let message, bad = false;
    try {
      const done = await post(path, body);
      message = "Done: " + Object.entries(done).map(([what, on]) => `${what} ${[].concat(on).join(", ")}`).join("; ");
    } catch (error) {
      message = "Refused: " + error.message;
      bad = true;
    }
    await render();
    say(message, bad);
  }

  function current() {
    const name = location.hash.replace("#", "");
    return views[name] ? name : "overview";
  }

  async function render() {
    const name = current();
    document.querySelectorAll("nav a").forEach((a) => {
      if (a.getAttribute("href") === "#" + name) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
    });
    const main = document.getElementById("view");
    const fresh = el("div", {});
    try {
      await views[name](fresh);
      const focused = document.activeElement && document.activeElement.id;
      main.replaceChildren(fresh);
      if (focused && document.getElementById(focused)) document.getElementById(focused).focus();
      say("Updated " + new Date().toLocaleTimeString());
    } catch (error) {
      say("Could not update: " + error.message, true);
    }
  }

  function schedule() {
    clearInterval(timer);
    // Live figures refresh every 2 s; the views an operator types into refresh on demand.
    if (current() === "overview") timer = setInterval(render, 2000);
  }

  async function start() {
    me = await get("me");
    document.getElementById("who").textContent = `${me.who} (${me.auth_mode})`;
    document.getElementById("logout").addEventListener("click", async () => {
      await fetch("/console/logout", { method: "POST", credentials: "same-origin", headers: { "X-CSRF-Token": me.csrf || "" } });
      location.assign("/console");
    });
    window.addEventListener("hashchange", () => { render(); schedule(); });
    await render();
    schedule();
  }

  document.addEventListener("DOMContentLoaded", start);
})();
