// One lane per question: its channel, streamed text, final audit fields and verify mark.
// Text goes in with textContent only, so an answer can never inject markup into the page.

const STATUS_TEXT = { queued: "queued", prefill: "prefill", streaming: "streaming", ok: "done" };

export class Lane {
  constructor(index, question) {
    const template = document.getElementById("lane-template");
    this.root = template.content.firstElementChild.cloneNode(true);
    this.index = index;
    this.question = question;
    this.result = null;
    this.tokenIds = [];
    this.part = (name) => this.root.querySelector(`.lane-${name}`);
    this.root.id = `lane-${index}`;
    this.root.setAttribute("aria-label", `Question ${index + 1}`);
    this.part("index").textContent = `#${index + 1}`;
    this.part("question").textContent = question.text;
    this.setChannel(null);
    this.setBucket(undefined);
    this.setStatus("queued");
  }

  setStatus(status) {
    this.root.dataset.status = status;
    this.part("status").textContent = STATUS_TEXT[status] || status;
  }

  get isWaiting() {
    return this.root.dataset.status === "queued" || this.root.dataset.status === "prefill";
  }

  setChannel(channelId) {
    this.channelId = channelId;
    this.part("channel").textContent = channelId === null ? `channel ${this.result ? "none" : "…"}` : `channel ${channelId}`;
  }

  setBucket(bucket) {
    // undefined: not known yet; null: the router strategy has no hash bucket.
    const text = bucket === undefined ? "…" : bucket === null ? "none" : String(bucket);
    this.part("bucket").textContent = `bucket ${text}`;
  }

  onDelta(delta) {
    if (this.result) return;
    if (delta.channel_id !== undefined && delta.channel_id !== this.channelId) this.setChannel(delta.channel_id);
    if (this.isWaiting) this.setStatus("streaming");
    this.part("text").append(delta.text);
    this.tokenIds.push(...(delta.token_ids || []));
  }

  onResult(result) {
    this.result = result;
    this.tokenIds = result.token_ids || this.tokenIds;
    this.setChannel(result.channel_id ?? null);
    this.setBucket(result.hash_bucket ?? null);
    this.part("text").textContent = result.text;  // the final text is authoritative
    this.setStatus(result.status);
    this.root.dataset.finished = "true";
    this.showAudit(result);
  }

  fail(message, status = "error") {
    if (this.result) return;
    this.setStatus(status);
    this.root.dataset.finished = "true";
    this.addAudit(status, message);
  }

  showAudit(r) {
    this.part("audit").replaceChildren();
    this.addAudit("elapsed", `${Math.round(r.elapsed_ms)} ms`);
    this.addAudit("tokens", `${r.prompt_tokens} prompt · ${r.completion_tokens} completion`);
    this.addAudit("finish", r.finish_reason ?? "—");
    this.addAudit("isolation", r.isolation);
    this.addAudit("numerics", r.numerics_fingerprint || "—");
    const verified = r.isolation_verified;
    this.addAudit("shadow check", verified === true ? "verified" : verified === false ? "MISMATCH" : "not sampled");
    if (r.rerouted) this.addAudit("rerouted", "yes");
    if (r.error) this.addAudit(r.status === "timeout" ? "placeholder" : "error", r.error);
  }

  addAudit(name, value) {
    const term = document.createElement("dt");
    const detail = document.createElement("dd");
    term.textContent = name;
    detail.textContent = value;
    this.part("audit").append(term, detail);
  }

  /** state: "checking" | "identical" | "different" | "skipped" | "error". */
  setVerify(state, detail = "") {
    const mark = this.part("verify");
    mark.dataset.state = state;
    const label = { checking: "checking alone…", identical: "✓ identical alone", different: "✗ different alone",
      skipped: "not compared", error: "check failed" }[state];
    mark.textContent = detail ? `${label} — ${detail}` : label;
  }
}

/** Replace the lanes in `container` with one per question. */
export function renderLanes(container, questions) {
  const lanes = questions.map((question, i) => new Lane(i, question));
  container.replaceChildren(...lanes.map((lane) => lane.root));
  return lanes;
}

/** Where two token id lists first differ, or -1 if they are equal. */
export function firstDifference(a, b) {
  const n = Math.max(a.length, b.length);
  for (let i = 0; i < n; i += 1) if (a[i] !== b[i]) return i;
  return -1;
}
