// The live channel pool (/v1/channels) and the engine's per-step counters (/v1/stats), polled.

import { ApiError } from "./api.js";

const POLL_MS = 700;
const WINDOW_S = 120;  // the charts show the last two minutes

export class PoolPanel {
  constructor(api, { onChannels, onAuthError, isMine }) {
    this.api = api;
    this.isMine = isMine;  // (request_id) => bool: the page's own request shows its lane numbers
    this.onChannels = onChannels;  // (channels) => void: lanes learn their hash bucket early
    this.onAuthError = onAuthError;
    this.steps = [];
    this.since = null;
    this.clockSkew = 0;  // server clock minus ours, so the charts' time axis uses the server's
    this.timer = null;
    this.generation = 0;  // a restart (new key) orphans the poll in flight instead of doubling the loop
    this.el = (id) => document.getElementById(id);
  }

  start() {
    this.stop();
    const generation = this.generation;
    this.timer = setTimeout(() => this.tick(generation), 0);
  }

  stop() {
    clearTimeout(this.timer);
    this.timer = null;
    this.generation += 1;
  }

  async tick(generation) {
    try {
      if (!document.hidden) await Promise.all([this.refreshChannels(), this.refreshStats()]);
    } catch (err) {
      if (generation !== this.generation) return;
      this.el("pool-summary").textContent = err instanceof ApiError ? err.describe() : String(err);
      if (err instanceof ApiError && err.status === 401) {
        this.timer = null;  // stay quiet until a key is typed
        this.onAuthError(err);
        return;
      }
    }
    if (generation !== this.generation) return;
    this.draw();
    this.timer = setTimeout(() => this.tick(generation), POLL_MS);
  }

  async refreshChannels() {
    const body = await this.api.get("/v1/channels");
    const tiles = body.channels.map((c) => channelTile(c, this.isMine(c.request_id)));
    this.el("pool").replaceChildren(...tiles);
    const size = body.channels.length;
    this.el("pool-summary").textContent =
      `${body.num_active} of ${size} channels busy · ${body.queue_length} question(s) waiting`;
    this.onChannels(body.channels);
  }

  async refreshStats() {
    const query = this.since === null ? "" : `?since=${this.since}`;
    const body = await this.api.get(`/v1/stats${query}`);
    this.clockSkew = body.now - Date.now() / 1000;
    this.steps.push(...body.steps);
    if (body.steps.length) this.since = body.steps[body.steps.length - 1].at;
    const oldest = body.now - WINDOW_S;
    while (this.steps.length && this.steps[0].at < oldest) this.steps.shift();
    const last = this.steps[this.steps.length - 1];
    this.el("last-step").textContent = last
      ? `Last step: ${last.num_channels} channel(s), ${last.num_tokens} token(s) in one forward, ` +
        `${last.step_ms.toFixed(1)} ms · ${body.num_steps} steps so far`
      : "No step yet.";
  }

  draw() {
    const now = Date.now() / 1000 + this.clockSkew;
    const seconds = perSecond(this.steps, now);
    const style = getComputedStyle(document.documentElement);
    drawBars(this.el("chart-tps"), seconds.map((s) => [s.at, s.sampled]), now, 1, style.getPropertyValue("--accent"));
    drawBars(this.el("chart-batch"), this.steps.map((s) => [s.at, s.num_channels]), now, 1,
      style.getPropertyValue("--decode"));
  }
}

function channelTile(c, mine) {
  const tile = document.createElement("li");
  tile.className = mine ? "channel mine" : "channel";
  tile.dataset.state = c.state;
  const who = c.request_id ? `, request ${c.request_id.slice(0, 6)} question #${c.index + 1}, ${c.tokens} tokens` : "";
  const queued = c.queued ? `; ${c.queued} queued behind it` : "";
  tile.title = `channel ${c.channel_id}: ${c.state}${who}${queued}; served ${c.num_served}`;
  tile.setAttribute("aria-label", tile.title);
  const id = document.createElement("span");
  id.textContent = c.channel_id;
  const what = document.createElement("small");
  // Our lanes by number; another caller's question by the start of its request id.
  what.textContent = !c.request_id ? "·" : mine ? `#${c.index + 1}` : c.request_id.slice(0, 4);
  tile.append(id, what);
  if (c.queued) {  // the router's per-channel queue (similar questions wait for their channel)
    const badge = document.createElement("b");
    badge.className = "queued";
    badge.textContent = `+${c.queued}`;
    tile.append(badge);
  }
  return tile;
}

/** Generated tokens summed per whole second of the server's clock. */
function perSecond(steps, now) {
  const sums = new Map();
  for (const s of steps) {
    const second = Math.floor(s.at);
    if (second >= now - WINDOW_S) sums.set(second, (sums.get(second) || 0) + s.num_sampled);
  }
  return [...sums].map(([at, sampled]) => ({ at: at + 0.5, sampled }));
}

/** Thin bars on a time axis ending at `now`; the y axis is labelled with its maximum. */
function drawBars(canvas, points, now, minMax, color) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth;
  const height = canvas.clientHeight;
  if (canvas.width !== Math.round(width * ratio)) canvas.width = Math.round(width * ratio);
  if (canvas.height !== Math.round(height * ratio)) canvas.height = Math.round(height * ratio);
  const g = canvas.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, width, height);
  const top = Math.max(minMax, ...points.map(([, v]) => v));
  const plot = { left: 26, right: width - 4, top: 6, bottom: height - 14 };
  const style = getComputedStyle(canvas);
  g.font = `10px ${style.fontFamily}`;
  g.fillStyle = style.color;
  g.strokeStyle = style.borderColor || "#ccc";
  g.lineWidth = 1;
  g.beginPath();
  g.moveTo(plot.left, plot.bottom + 0.5);
  g.lineTo(plot.right, plot.bottom + 0.5);
  g.stroke();
  g.textAlign = "right";
  g.fillText(String(Math.round(top)), plot.left - 4, plot.top + 8);
  g.fillText("0", plot.left - 4, plot.bottom);
  g.textAlign = "left";
  g.fillText(`−${WINDOW_S / 60} min`, plot.left, height - 2);
  g.textAlign = "right";
  g.fillText("now", plot.right, height - 2);
  g.fillStyle = color.trim() || "#36c";
  const span = plot.right - plot.left;
  const barWidth = Math.max(2, span / WINDOW_S - 1);
  for (const [at, value] of points) {
    const x = plot.right - ((now - at) / WINDOW_S) * span;
    if (x < plot.left) continue;
    const h = (value / top) * (plot.bottom - plot.top);
    g.fillRect(x - barWidth / 2, plot.bottom - h, barWidth, h);
  }
  canvas.setAttribute("aria-label", `${canvas.getAttribute("aria-label").split(":")[0]}: peak ${Math.round(top)}`);
}
