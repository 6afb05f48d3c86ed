"""`serve --ui`: a chat page at `/` to watch the gate work. A question typed there streams back from the server's
own /v1/chat/completions, each token coloured by its surprise as it arrives, and each round (what fired it, the
evidence and its source, what was dropped) shown as it happens; at the end, a link to the reply's receipt page.

Plain HTML and one script, both from this server: the page's policy lets it load and call nothing else (no CDN,
no build step). Every text from the model, the store or the web is put in the page as text, never as markup.
"""

from __future__ import annotations

from ..receipt_view import DEEPEST_BITS

# The page may run only this server's script, call only this server, and load nothing else.
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; img-src data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>surprisegate</title>
<style>
body { font: 15px/1.5 system-ui, sans-serif; max-width: 860px; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { font-size: 1.3em; } form { display: grid; gap: 0.5em; }
textarea { font: inherit; padding: 0.5em; min-height: 3.5em; }
.row { display: flex; gap: 0.8em; align-items: center; flex-wrap: wrap; font-size: 0.9em; color: #555; }
button { font: inherit; padding: 0.3em 1.2em; }
#reply { white-space: pre-wrap; border: 1px solid #ddd; border-radius: 6px; padding: 0.8em; min-height: 2.5em;
         margin-top: 1em; }
.tok { border-radius: 2px; }
.round { border-left: 4px solid #c33; padding: 0.3em 0.8em; margin: 0.8em 0; background: #fafafa; }
.round.rewound { border-color: #0a6; } .round.reverted { border-color: #d90; }
del { color: #b22; } .evidence { background: #eefbe9; padding: 0.2em 0.4em; border-radius: 3px; }
.source { color: #555; font-family: monospace; font-size: 0.9em; } #status { color: #666; font-size: 0.9em; }
</style>
</head>
<body>
<h1>surprisegate</h1>
<form id="ask">
<textarea id="question" placeholder="Ask a question" required></textarea>
<div class="row">
<label>mode <select id="mode"><option>intervene</option><option>detect</option></select></label>
<label>max tokens <input id="max-tokens" type="number" value="64" min="1" max="512" style="width:5em"></label>
<label>API key <input id="key" type="password" autocomplete="off" placeholder="if the server has one"></label>
<button id="send" type="submit">Ask</button>
<span id="status"></span>
</div>
</form>
<div id="reply" aria-live="polite"></div>
<div id="rounds"></div>
<p><a id="receipt-link" hidden target="_blank" rel="noopener">the receipt of this reply</a></p>
<p class="row">Tokens are coloured by their surprise (deeper red: more surprising; hover for bits). A round fires
when the window of surprise crosses its threshold: the doubtful words are dropped, never shown, and written again
with the evidence.</p>
<script src="/ui.js"></script>
</body>
</html>
"""

_SCRIPT_BODY = """
const LN2 = Math.log(2);
const $ = (id) => document.getElementById(id);

// The colour of receipt_view.surprise_colour: none under 1 bit, then ever deeper red.
function colour(bits) {
  if (!(bits >= 1)) return "transparent";
  return "rgba(220,40,40," + (Math.min(1, bits / DEEPEST_BITS) * 0.75).toFixed(2) + ")";
}

function line(parent, label, text, cls) {
  const div = document.createElement("div");
  if (label) div.append(label + " ");
  const span = document.createElement(cls === "doubted" ? "del" : "span");
  span.className = cls || "";
  span.textContent = text;
  div.append(span);
  parent.append(div);
  return div;
}

function roundBox(rounds, n) {
  let box = rounds.querySelector('[data-round="' + n + '"]');
  if (!box) {
    box = document.createElement("div");
    box.className = "round";
    box.dataset.round = String(n);
    const title = document.createElement("b");
    title.textContent = "Round " + n;
    box.append(title);
    rounds.append(box);
  }
  return box;
}

// One round event from the stream: the trigger, the arms' answer, then the rewind (or none).
function showEvent(event, rounds) {
  const box = roundBox(rounds, event.round);
  if (event.type === "trigger") {
    box.append(": " + event.statistic + " " + Number(event.value).toFixed(2) + " > " +
               Number(event.threshold).toFixed(2));
    line(box, "doubted:", event.span_text, "doubted");
  } else if (event.type === "grounding") {
    if (event.found && event.evidence) {
      const div = line(box, "evidence:", event.evidence, "evidence");
      const source = document.createElement("span");
      source.className = "source";
      source.textContent = " " + (event.source || "");
      div.append(source);
    } else {
      line(box, "", "no evidence: " + event.reason, "note");
    }
  } else if (event.type === "rewind") {
    const action = event.reverted ? "reverted" : "rewound";
    box.classList.add(action);
    box.dataset.action = action;
    line(box, action + ":", event.dropped_text ? "dropped \\u201c" + event.dropped_text + "\\u201d" : "", "note");
  }
}

function showTokens(choice, reply) {
  const tokens = choice.logprobs && choice.logprobs.content;
  if (!tokens || !tokens.length) {
    if (choice.delta && choice.delta.content) reply.append(choice.delta.content);
    return;
  }
  for (const t of tokens) {
    const span = document.createElement("span");
    const bits = -t.logprob / LN2;
    span.className = "tok";
    span.textContent = t.token;
    span.style.backgroundColor = colour(bits);
    span.title = bits.toFixed(2) + " bits";
    reply.append(span);
  }
}

// Server-sent events: "data: {json}" lines, blank-line separated; comments (":") are keep-alives.
async function readEvents(body, onData) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\\n\\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const row of block.split("\\n")) {
        if (row.startsWith("data: ") && row !== "data: [DONE]") onData(JSON.parse(row.slice(6)));
      }
    }
  }
}

// The served model's id, asked of the server once (a request must name it).
let servedModel = null;
async function modelId(headers) {
  if (servedModel) return servedModel;
  const response = await fetch("/v1/models", { headers });
  const body = await response.json();
  if (!response.ok) throw new Error((body.error && body.error.message) || response.statusText);
  servedModel = body.data[0].id;
  return servedModel;
}

async function ask(event) {
  event.preventDefault();
  const question = $("question").value.trim();
  if (!question) return;
  const reply = $("reply"), rounds = $("rounds"), status = $("status"), link = $("receipt-link");
  reply.textContent = "";
  rounds.textContent = "";
  link.hidden = true;
  status.textContent = "writing\\u2026";
  $("send").disabled = true;
  document.body.dataset.state = "writing";
  const headers = { "content-type": "application/json" };
  const key = $("key").value.trim();
  if (key) headers.authorization = "Bearer " + key;
  const request = {
    model: null,
    messages: [{ role: "user", content: question }],
    stream: true,
    logprobs: true,
    max_tokens: Number($("max-tokens").value) || 64,
    surprisegate: { mode: $("mode").value, events: true },
  };
  try {
    request.model = await modelId(headers);
    const response = await fetch("/v1/chat/completions", { method: "POST", headers, body: JSON.stringify(request) });
    if (!response.ok) {
      const err = await response.json().catch(() => ({}));
      throw new Error((err.error && err.error.message) || response.statusText);
    }
    const id = response.headers.get("x-surprisegate-receipt");
    await readEvents(response.body, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message);
      const gate = chunk.surprisegate || {};
      if (gate.event) showEvent(gate.event, rounds);
      for (const choice of chunk.choices || []) showTokens(choice, reply);
    });
    status.textContent = "done";
    if (id && !key) {  // the receipt page needs the key in a header, which a link cannot send
      link.href = "/receipts/" + encodeURIComponent(id);
      link.hidden = false;
    }
  } catch (err) {
    status.textContent = "error: " + err.message;
  } finally {
    $("send").disabled = false;
    document.body.dataset.state = "done";
  }
}

$("ask").addEventListener("submit", ask);
"""
SCRIPT = f'"use strict";\nconst DEEPEST_BITS = {DEEPEST_BITS!r};' + _SCRIPT_BODY
