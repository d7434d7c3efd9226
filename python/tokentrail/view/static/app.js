// tokentrail viewer: sessions, a session's tree and ledger, a turn's tokens by fate.
// Plain JS, no build step, nothing fetched but this server's JSON API.
"use strict";

const main = document.getElementById("main");
const tip = document.getElementById("tip");
const POLL_MS = 2000;   // live: sessions and a session's ledger are read again this often
// Tokens rendered at a time; the next chunk when its marker scrolls in (`?chunk=all`: at once).
const CHUNK = new URLSearchParams(location.search).get("chunk") === "all" ? Infinity : 2000;
let token = sessionStorage.getItem("tokentrail-admin") || "";
let view = null;        // {kind, sid, turn, body}: what is on screen, for the poller

// -- the API -----------------------------------------------------------------------------------

class Locked extends Error {}

async function api(path) {
  const headers = token ? {Authorization: "Bearer " + token} : {};
  const r = await fetch("api/" + path, {headers, cache: "no-store"});
  const text = await r.text();
  if (r.status === 401 || r.status === 403) throw new Locked(JSON.parse(text).error.message);
  if (!r.ok) {
    let message = text;
    try { message = JSON.parse(text).error.message; } catch (e) { /* not JSON */ }
    throw new Error(`${r.status}: ${message}`);
  }
  return {text, body: JSON.parse(text)};
}

function login(message) {
  main.hidden = true;
  const form = document.getElementById("login");
  form.hidden = false;
  document.getElementById("login-error").textContent = token ? message : "";
  form.onsubmit = (e) => {
    e.preventDefault();
    token = document.getElementById("token").value;
    sessionStorage.setItem("tokentrail-admin", token);
    form.hidden = true;
    main.hidden = false;
    route();
  };
}

// -- small DOM helpers -------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

const fmt = (n) => Number(n).toLocaleString("en-US");
const pct = (a, b) => (b ? (100 * a / b).toFixed(1) + "%" : "–");

function bar(parts, total) {
  // parts: [[fate, n], ...]; the rest of `total` stays the bar's background.
  const b = el("div", {class: "bar"});
  for (const [fate, n] of parts) {
    if (!n || !total) continue;
    b.append(el("i", {class: "f-" + fate, style: `width:${100 * n / total}%`,
                      title: `${fate}: ${fmt(n)}`}));
  }
  return b;
}

function legend(names) {
  return el("div", {class: "legend"},
    ...names.map((n) => el("span", {}, el("i", {class: "f-" + n}), n)));
}

function card(field, value, label) {
  return el("div", {class: "card"}, el("b", {"data-field": field, text: value}), el("span", {text: label}));
}

function put(...nodes) {
  // The page's content; null stands for a part this page does not have.
  main.replaceChildren(...nodes.filter((n) => n !== null && n !== undefined && n !== ""));
}

function crumbs(...parts) {
  const nav = document.getElementById("crumbs");
  nav.replaceChildren();
  parts.forEach(([text, href], i) => {
    if (i) nav.append(" / ");
    nav.append(href ? el("a", {href, text}) : el("span", {text}));
  });
}

// -- pages -------------------------------------------------------------------------------------

function showSource(src) {
  document.getElementById("source").textContent =
    `${src.kind}${src.path ? ": " + src.path : ""}${src.tokenizer ? " · " + src.tokenizer : ""}`;
}

function sessionsPage(body) {
  showSource(body.source);
  crumbs(["sessions"]);
  const rows = body.sessions.map((s) => {
    const masked = Object.entries(s.masked);
    const maskedTotal = masked.reduce((a, [, n]) => a + n, 0);
    return el("tr", {class: "link", "data-sid": s.sid, onclick: () => go(`#/s/${encodeURIComponent(s.sid)}`)},
      el("td", {}, el("a", {href: `#/s/${encodeURIComponent(s.sid)}`, text: s.sid})),
      el("td", {text: s.state}),
      el("td", {class: "num", "data-field": "turns", text: fmt(s.turns)}),
      el("td", {class: "num", "data-field": "samples", text: fmt(s.samples)}),
      el("td", {class: "num", "data-field": "generated", text: s.generated === null ? "–" : fmt(s.generated)}),
      el("td", {class: "num", "data-field": "trained", text: fmt(s.trained)}),
      el("td", {class: "num", "data-field": "masked", text: fmt(maskedTotal)}),
      el("td", {}, bar([["trained", s.trained], ...masked], s.generated ?? s.response_tokens),
        el("div", {class: "muted", text: masked.map(([r, n]) => `${r} ${fmt(n)}`).join(", ")})));
  });
  put(
    el("h2", {text: `${body.sessions.length} session${body.sessions.length === 1 ? "" : "s"}`}),
    legend(["trained", "realigned", "truncated", "excluded", "merged_rewrite", "superseded", "constrained"]),
    el("table", {id: "sessions"},
      el("thead", {}, el("tr", {}, ...["session", "state", "turns", "samples", "generated", "trained",
        "masked", "generated tokens"].map((h, i) => el("th", {class: i > 1 && i < 7 ? "num" : null, text: h})))),
      el("tbody", {}, ...rows)),
    body.sessions.length ? "" : el("p", {class: "muted", text: "No sessions yet: they appear as turns arrive."}));
}

function treeList(nodes, sid) {
  const kids = new Map();
  for (const n of nodes) {
    if (n.parent === null) continue;
    if (!kids.has(n.parent)) kids.set(n.parent, []);
    kids.get(n.parent).push(n);
  }
  const nodeEl = (n) => {
    const parts = [];
    if (n.reason && n.reason !== "main") parts.push(el("span", {class: "reason r-" + n.reason, text: n.reason.replace("_", " ")}));
    if (n.via) parts.push(el("span", {class: "via", text: `+${n.via} msg`}));
    if (n.kind !== "turn") {
      return el("span", {class: "node"}, el("i", {text: n.kind === "root" ? "session" : `branch at ${n.role}`}),
        ...parts, el("span", {class: "label", text: n.label || ""}));
    }
    const maskedTotal = Object.values(n.masked || {}).reduce((a, b) => a + b, 0);
    const cls = "node turn" + (n.excluded ? " excluded" : maskedTotal ? " masked" : "");
    return el("span", {class: cls, "data-turn": n.turn_index,
                       onclick: () => go(`#/s/${encodeURIComponent(sid)}/t/${n.turn_index}`)},
      el("b", {text: `#${n.turn_index}`}), ...parts,
      n.tools && n.tools.length ? el("span", {text: n.tools.join(", ")}) : null,
      el("span", {class: "via", text: `${fmt(n.trained)}/${fmt(n.generated)}`}),
      n.demoted ? el("span", {class: "reason r-rewritten", text: `rewrite merged #${n.demoted.join(", #")}`}) : null,
      el("span", {class: "label", text: n.label}));
  };
  const item = (n) => {
    const li = el("li", {}, nodeEl(n));
    const ul = el("ul");
    let children = kids.get(n.id) || [];
    // A line of single children reads as a line, not a staircase.
    while (children.length === 1) {
      ul.append(el("li", {}, nodeEl(children[0])));
      children = kids.get(children[0].id) || [];
    }
    for (const c of children) ul.append(item(c));
    if (ul.childNodes.length) li.append(ul);
    return li;
  };
  const root = nodes.find((n) => n.parent === null);
  return el("ul", {class: "tree", id: "tree"}, item(root));
}

function samplesPage(body) {
  // Exported samples: no ledger and no tree, only what each sample trains.
  const sid = body.sid;
  crumbs(["sessions", "#/"], [sid]);
  put(
    el("h2", {text: `Session ${sid} (exported samples)`}),
    el("div", {class: "cards"},
      card("trained", fmt(body.trained), "trained tokens"),
      card("samples", fmt(body.samples), "samples"),
      card("response", fmt(body.response_tokens), "response tokens")),
    el("p", {class: "muted", text: "A sample file carries no ledger: what its loss masks leave out may be a tool result or a masked generated token, and why is not recorded. View the journal the samples came from to see every token's fate."}),
    el("table", {id: "samples"}, el("thead", {}, el("tr", {}, ...["sample", "turns", "tokens", "trained", ""].map((h) => el("th", {text: h})))),
      el("tbody", {}, ...body.sample_list.map((s) => el("tr", {class: "link", "data-sample": s.index,
          onclick: () => go(`#/s/${encodeURIComponent(sid)}/t/${s.index}`)},
        el("td", {text: `sample ${s.index}`}), el("td", {text: s.turns.join(", ")}),
        el("td", {class: "num", text: fmt(s.tokens)}),
        el("td", {class: "num", "data-field": "trained", text: fmt(s.trained)}),
        el("td", {}, bar([["trained", s.trained], ["not_trained", s.response_length - s.trained]], s.response_length)))))));
}

function sessionPage(body) {
  if (body.ledger === null) return samplesPage(body);
  const sid = body.sid;
  crumbs(["sessions", "#/"], [sid]);
  const L = body.ledger;
  const masked = Object.entries(L.masked_tokens);
  const maskedTotal = masked.reduce((a, [, n]) => a + n, 0);
  const tools = Object.entries(L.by_tool).map(([tool, r]) =>
    el("tr", {"data-tool": tool},
      el("td", {text: tool}), el("td", {class: "num", text: fmt(r.turns)}),
      el("td", {class: "num", "data-field": "tool-trained", text: fmt(r.tokens_trained)}),
      el("td", {class: "num", "data-field": "tool-masked", text: fmt(r.tokens_masked)}),
      el("td", {}, bar([["trained", r.tokens_trained], ["realigned", r.tokens_masked]], r.tokens_trained + r.tokens_masked))));
  const turns = L.turns.map((t) => {
    const m = Object.entries(t.masked);
    return el("tr", {class: "link", "data-turn": t.turn_index, onclick: () => go(`#/s/${encodeURIComponent(sid)}/t/${t.turn_index}`)},
      el("td", {class: "num", text: t.turn_index}),
      el("td", {text: (t.tools || []).join(", ") || "(text)"}),
      el("td", {class: "num", "data-field": "generated", text: fmt(t.generated)}),
      el("td", {class: "num", "data-field": "trained", text: fmt(t.trained)}),
      el("td", {"data-field": "masked", text: m.map(([r, n]) => `${r} ${n}`).join(", ")}),
      el("td", {text: [t.history, t.excluded ? "excluded: " + t.excluded : null, t.superseded ? "superseded" : null].filter(Boolean).join(" · ")}),
      el("td", {}, bar([["trained", t.trained], ...m], t.generated)));
  });
  put(
    el("h2", {text: `Session ${sid}`}),
    el("div", {class: "cards"},
      card("generated", fmt(L.generated_tokens), "generated tokens"),
      card("trained", fmt(L.trained_tokens), `trained (${pct(L.trained_tokens, L.generated_tokens)})`),
      card("masked", fmt(maskedTotal), "masked"),
      ...masked.map(([r, n]) => card("masked-" + r, fmt(n), "masked: " + r)),
      card("samples", fmt(body.samples), "samples"),
      card("restored", fmt(L.restored_echoes), "echoes restored"),
      card("fallbacks", fmt(Object.values(L.splice_fallbacks).reduce((a, b) => a + b, 0)), "splice fallbacks")),
    bar([["trained", L.trained_tokens], ...masked], L.generated_tokens),
    legend(["trained", ...masked.map(([r]) => r)]),
    (L.lost || []).length ? el("div", {class: "box", id: "lost"},
      el("b", {text: "The journal lost part of this session before it was linearized: "}),
      L.lost.map((x) => `${x.turns < 0 ? "unknown" : x.turns} turns in ${x.events < 0 ? "unknown" : x.events} events from event ${x.first} (${x.reason})`).join("; ")) : null,
    el("div", {class: "cols"},
      el("section", {}, el("h3", {text: "Conversation tree"}), treeList(body.tree, sid)),
      el("section", {},
        el("h3", {text: "By tool"}),
        el("table", {id: "by-tool"}, el("thead", {}, el("tr", {}, ...["tool", "turns", "trained", "masked", ""].map((h) => el("th", {text: h})))),
          el("tbody", {}, ...tools)),
        el("h3", {text: "Turns"}),
        el("table", {id: "turns"}, el("thead", {}, el("tr", {}, ...["#", "tools", "generated", "trained", "masked", "history", ""].map((h) => el("th", {text: h})))),
          el("tbody", {}, ...turns)),
        el("h3", {text: `Samples (${body.sample_list.length})`}),
        el("table", {}, el("tbody", {}, ...body.sample_list.map((s) => el("tr", {},
          el("td", {text: `sample ${s.index}`}), el("td", {text: `turns ${s.turns.join(", ")}`}),
          el("td", {class: "num", text: `${fmt(s.trained)} trained / ${fmt(s.tokens)} tokens`}),
          el("td", {text: s.truncated ? "truncated" : ""}))))),
        body.drifts.length ? el("h3", {text: "Drifts"}) : null,
        body.drifts.length ? el("table", {}, el("tbody", {}, ...body.drifts.map((d) =>
          el("tr", {}, el("td", {text: `turn ${d.turn_index}`}), el("td", {text: d.kind}),
            el("td", {text: `at ${d.at}, ${d.drifted} tokens`}))))) : null)));
}

function tokenTip(t, kind, i) {
  const o = t.output;
  if (kind === "p") return `prompt token ${t.prompt.shared + i}\nid ${t.prompt.ids[i]}`;
  const lines = [`output token ${i}`, `id ${o.ids[i]}`, `fate ${t.fates[o.fates[i]]}`];
  if (o.logprobs) lines.push(`logprob ${o.logprobs[i]}`);
  lines.push(`weights ${o.version[i] >= 0 ? o.versions[o.version[i]] : "(not reported)"}`);
  for (const [channel, status] of Object.entries(o.replay)) lines.push(`${channel} ${t.replay_status[status[i]]}`);
  if (!Object.keys(o.replay).length) lines.push("routing (not kept)");
  return lines.join("\n");
}

function tokenRuns(t) {
  // Prompt (new part) then output, rendered CHUNK spans at a time as the reader scrolls.
  const box = el("div", {class: "tokens", id: "tokens"});
  const p = t.prompt, o = t.output;
  const items = [];
  for (let i = 0; i < p.ids.length; i++) items.push(["p", i]);
  for (let i = 0; i < o.ids.length; i++) items.push(["o", i]);
  const text = (kind, i) => {
    const src = kind === "p" ? p : o;
    return src.text ? src.text[i] : `[${src.ids[i]}]`;
  };
  let done = 0;
  const more = el("span", {class: "more"});
  const observer = new IntersectionObserver((entries) => {
    if (entries.some((e) => e.isIntersecting)) renderNext();
  });
  function renderNext() {
    const frag = document.createDocumentFragment();
    const end = Math.min(items.length, done + CHUNK);
    for (; done < end; done++) {
      const [kind, i] = items[done];
      const cls = kind === "p" ? "p" : "f-" + t.fates[o.fates[i]];
      frag.append(el("span", {class: cls, "data-k": kind, "data-i": i, text: text(kind, i)}));
    }
    more.before(frag);
    box.dataset.rendered = done;
    if (done >= items.length) { observer.disconnect(); more.remove(); }
    else more.textContent = `… ${fmt(items.length - done)} more tokens (scroll)`;
  }
  box.append(more);
  renderNext();
  observer.observe(more);
  box.addEventListener("mousemove", (e) => {
    const span = e.target.closest("span[data-k]");
    if (!span) { tip.hidden = true; return; }
    tip.textContent = tokenTip(t, span.dataset.k, Number(span.dataset.i));
    tip.hidden = false;
    tip.style.left = Math.min(e.clientX + 12, window.innerWidth - 260) + "px";
    tip.style.top = (e.clientY + 14) + "px";
  });
  box.addEventListener("mouseleave", () => { tip.hidden = true; });
  return box;
}

function turnPage(sid, t) {
  const what = t.sample ? "sample" : "turn";
  crumbs(["sessions", "#/"], [sid, `#/s/${encodeURIComponent(sid)}`], [`${what} ${t.turn_index}`]);
  const counts = Object.entries(t.fate_counts);
  const p = t.prompt;
  put(
    el("h2", {text: `${t.sample ? "Sample" : "Turn"} ${t.turn_index}${t.tools.length ? " · " + t.tools.join(", ") : ""}`}),
    el("div", {class: "cards"},
      card("generated", fmt(t.generated), t.sample ? "response tokens" : "generated tokens"),
      card("trained", fmt(t.trained), "trained"),
      ...Object.entries(t.masked).map(([r, n]) => card("masked-" + r, fmt(n), "masked: " + r)),
      card("prompt", fmt(p.length), "prompt tokens"),
      card("history", t.history || "–", "prompt built by"),
      card("finish", t.finish_reason || "–", "finish reason")),
    bar(counts, t.generated),
    el("p", {id: "turn-consistent", class: t.consistent === null ? "muted" : t.consistent ? "ok" : "bad",
      text: t.consistent === null ? "An exported sample: its loss mask says what trains, not why the rest does not."
        : t.consistent ? "Token colours add up to the ledger's counts."
        : `Token colours ${JSON.stringify(t.fate_counts)} differ from the ledger ${JSON.stringify(t.ledger_counts)}.`}),
    t.excluded ? el("div", {class: "box", text: `Excluded from training: ${t.excluded}`}) : null,
    t.superseded ? el("div", {class: "box", text: "Superseded: the harness asked again from this prompt and a fresh generation replaced this one."}) : null,
    t.fallback ? el("div", {class: "box", id: "fallback"},
      el("b", {text: `Splice fell back to a full render: ${t.fallback.reason}. `}),
      t.fallback.previous || t.fallback.rendered
        ? `The render departs from the previous turn's ${fmt(t.fallback.previous_length)} tokens at position ${t.fallback.at}: `
          + `previous ${t.fallback.previous ? `${t.fallback.previous.id} ${JSON.stringify(t.fallback.previous.text)}` : "(ended)"}, `
          + `rendered ${t.fallback.rendered ? `${t.fallback.rendered.id} ${JSON.stringify(t.fallback.rendered.text)}` : "(ended)"}.`
        : "The render holds the previous turn's tokens whole.") : null,
    legend(["prompt", ...t.fates.filter((f) => t.fate_counts[f])]),
    el("p", {class: "muted", text: p.previous_turn !== null
      ? `Prompt tokens 0–${p.shared - 1} are turn ${p.previous_turn}'s prompt and output; shown from ${p.shared} (${fmt(p.ids.length)} new), then the ${fmt(t.output.ids.length)} generated.`
      : `The whole prompt (${fmt(p.ids.length)} tokens), then the ${fmt(t.output.ids.length)} generated.`}),
    tokenRuns(t),
    t.echoes.length ? el("h3", {text: "Echo restored: the harness sent back other bytes than were generated"}) : null,
    ...t.echoes.map((echo) => el("div", {class: "pair echo"},
      el("div", {}, el("b", {text: "generated (trained)"}), el("pre", {class: "msg", text: JSON.stringify(t.message, null, 2)})),
      el("div", {}, el("b", {text: "harness's echo"}), el("pre", {class: "msg", text: JSON.stringify(echo, null, 2)})))),
    t.echoes.length ? null : el("details", {}, el("summary", {text: "message"}), el("pre", {class: "msg", text: JSON.stringify(t.message, null, 2)})));
}

// -- routing and live updates ------------------------------------------------------------------

function go(hash) { location.hash = hash; }

async function load(kind, sid, turn) {
  if (kind === "sessions") return api("sessions");
  if (kind === "session") return api(`sessions/${encodeURIComponent(sid)}`);
  return api(`sessions/${encodeURIComponent(sid)}/turns/${turn}`);
}

function show(kind, sid, body) {
  if (kind === "sessions") sessionsPage(body);
  else if (kind === "session") sessionPage(body);
  else turnPage(sid, body);
  document.body.dataset.page = kind;
}

async function route() {
  const m = location.hash.match(/^#\/s\/([^/]+)(?:\/t\/(\d+))?$/);
  const kind = !m ? "sessions" : m[2] === undefined ? "session" : "turn";
  const sid = m ? decodeURIComponent(m[1]) : null;
  const turn = m ? m[2] : null;
  try {
    const t0 = performance.now();
    const {text, body} = await load(kind, sid, turn);
    if (kind !== "sessions" && !document.getElementById("source").textContent) {
      showSource((await api("source")).body);
    }
    view = {kind, sid, turn, text};
    show(kind, sid, body);
    document.body.dataset.shownMs = (performance.now() - t0).toFixed(1);
    window.scrollTo(0, 0);
  } catch (e) {
    if (e instanceof Locked) return login(e.message);
    put(el("p", {class: "bad", id: "error", text: String(e.message || e)}));
  }
}

async function poll() {
  if (!view || view.kind === "turn" || document.hidden) return;
  const seen = view;
  try {
    const {text, body} = await load(seen.kind, seen.sid, seen.turn);
    if (view !== seen || text === seen.text) return;
    view = {...seen, text};
    const y = window.scrollY;
    show(seen.kind, seen.sid, body);
    window.scrollTo(0, y);
  } catch (e) { /* the next poll tries again */ }
}

window.addEventListener("hashchange", route);
setInterval(poll, POLL_MS);
route();
