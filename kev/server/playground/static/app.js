// The playground's controller: question rows, one streamed request, "verify isolation", the API key.

import { Api, ApiError } from "./api.js";
import { firstDifference, renderLanes } from "./lanes.js";
import { PoolPanel } from "./pool.js";
import { Rows } from "./rows.js";

const EXAMPLES = ["What is the capital of France?", "用一句话介绍北京。", "Write a haiku about the sea."];
const $ = (id) => document.getElementById(id);

const api = new Api();
const rows = new Rows($("rows"), $("row-template"));
const state = { lanes: [], sent: null, requestId: null, controller: null };
const pool = new PoolPanel(api, {
  onChannels: showBuckets, onAuthError: askForKey, isMine: (requestId) => requestId !== null && requestId === state.requestId,
});

function say(message) {
  $("form-message").textContent = message;
}

function askForKey(err) {
  say(`${err.describe()}. Type the server's API key at the top of the page.`);
  $("api-key").setAttribute("aria-invalid", "true");
  $("server-state").dataset.state = "locked";
  $("server-state").textContent = "needs an API key";
}

/** Read the form into the request it describes (per-row timeouts become question objects). */
function readRequest() {
  const number = (id) => ($(id).value.trim() === "" ? undefined : Number($(id).value));
  const queries = rows.read().map(({ text, timeoutMs }) => (timeoutMs === undefined ? text : { text, timeout_ms: timeoutMs }));
  const body = {
    queries, isolation: $("isolation").value, max_tokens: number("max-tokens"), temperature: number("temperature"),
    seed: number("seed"), timeout_ms: number("timeout"), system: $("system").value.trim() || undefined,
  };
  return JSON.parse(JSON.stringify(body));  // drops the undefined options: the server's defaults apply
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  $("verify").disabled = busy || !state.lanes.some((lane) => lane.result?.status === "ok");
}

async function send(event) {
  event.preventDefault();
  if (state.controller) return;
  const body = readRequest();
  if (!body.queries.length) {
    say("Type at least one question.");
    rows.focusFirst();
    return;
  }
  say("");
  state.sent = body;
  state.requestId = null;
  state.lanes = renderLanes($("lanes"), body.queries.map((q) => ({ text: typeof q === "string" ? q : q.text })));
  state.controller = new AbortController();
  setBusy(true);
  const started = performance.now();
  $("run-summary").textContent = `${body.queries.length} question(s) sent as one request…`;
  try {
    const { requestId, events } = await api.stream("/v1/query", body, state.controller.signal);
    state.requestId = requestId;
    for await (const { event, data } of events) {
      if (event === "delta") state.lanes[data.index]?.onDelta(data);
      else if (event === "result") state.lanes[data.index]?.onResult(data);
    }
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    const counts = countStatuses(state.lanes);
    $("run-summary").textContent = `request ${requestId || ""} finished in ${seconds} s: ${counts}`;
  } catch (err) {
    const stopped = err.name === "AbortError";
    const message = stopped ? "stopped from this page" : err instanceof ApiError ? err.describe() : String(err);
    state.lanes.forEach((lane) => lane.fail(message, stopped ? "cancelled" : "error"));
    $("run-summary").textContent = "";
    if (err instanceof ApiError && err.status === 401) askForKey(err);
    else say(stopped ? "Stopped: closing the stream cancelled the unfinished questions." : message);
  } finally {
    state.controller = null;
    setBusy(false);
  }
}

function countStatuses(lanes) {
  const counts = {};
  for (const lane of lanes) {
    const status = lane.result?.status || lane.root.dataset.status;
    counts[status] = (counts[status] || 0) + 1;
  }
  return Object.entries(counts).map(([status, n]) => `${n} ${status}`).join(", ");
}

/** Ask each answered question again, alone, with the same parameters; compare token ids with its lane. */
async function verify() {
  const { queries, ...options } = state.sent;
  setBusy(true);
  $("stop").disabled = true;  // the checks are short requests of their own; nothing to stop mid-way
  let identical = 0;
  let compared = 0;
  for (const lane of state.lanes) {
    if (lane.result?.status !== "ok") {
      lane.setVerify("skipped", `status ${lane.result?.status || "unknown"}`);
      continue;
    }
    lane.setVerify("checking");
    try {
      const alone = (await api.post("/v1/query", { ...options, queries: [queries[lane.index]] })).results[0];
      const at = firstDifference(lane.tokenIds, alone.token_ids);
      compared += 1;
      if (at < 0) identical += 1;
      const sampled = options.temperature > 0 && options.seed === undefined ? "sampled without a seed" : "";
      if (at < 0) lane.setVerify("identical", `${alone.token_ids.length} tokens, channel ${alone.channel_id}`);
      else lane.setVerify("different", sampled || `first differs at token ${at}`);
    } catch (err) {
      lane.setVerify("error", err instanceof ApiError ? err.describe() : String(err));
      if (err instanceof ApiError && err.status === 401) askForKey(err);
    }
  }
  $("run-summary").textContent = `Verify isolation: ${identical} of ${compared} answer(s) identical to the question alone`;
  setBusy(false);
}

/** While a request runs, /v1/channels tells which channel holds which question, its bucket, and prefill. */
function showBuckets(channels) {
  if (!state.controller || !state.requestId) return;
  for (const c of channels) {
    const lane = c.request_id === state.requestId ? state.lanes[c.index] : null;
    if (lane && !lane.result) {
      lane.setChannel(c.channel_id);
      if (c.hash_bucket !== undefined) lane.setBucket(c.hash_bucket);
      if (c.state === "prefill" && lane.isWaiting) lane.setStatus("prefill");
    }
  }
}

async function checkServer() {
  const badge = $("server-state");
  try {
    const ready = await api.get("/readyz");
    badge.dataset.state = "ready";
    badge.textContent = `ready · ${ready.model}`;
    $("api-key").removeAttribute("aria-invalid");
    pool.start();
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) return askForKey(err);
    badge.dataset.state = "loading";
    badge.textContent = err instanceof ApiError && err.status === 503 ? "model loading…" : "server unreachable";
    setTimeout(checkServer, 2000);
  }
}

function useKey(event) {
  event?.preventDefault();
  api.setKey($("api-key").value, $("remember-key").checked);
  say("");
  pool.stop();
  checkServer();
}

function init() {
  EXAMPLES.forEach((text) => rows.add(text));
  $("api-key").value = api.key;
  $("remember-key").checked = api.isRemembered;
  $("key-form").addEventListener("submit", useKey);
  $("api-key").addEventListener("change", useKey);
  $("remember-key").addEventListener("change", useKey);
  $("ask-form").addEventListener("submit", send);
  $("add-row").addEventListener("click", () => rows.add("", { focus: true }));
  $("stop").addEventListener("click", () => state.controller?.abort());
  $("verify").addEventListener("click", verify);
  document.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("ask-form").requestSubmit();
  });
  window.addEventListener("resize", () => pool.draw());
  checkServer();
}

init();
