// The page's only door to Kev: same-origin fetch() with the key the user typed.
// The key never comes from the page source; it lives in memory, or in sessionStorage if asked.

const KEY_ITEM = "kev.apiKey";

export class ApiError extends Error {
  constructor(status, message, field = null) {
    super(message);
    this.status = status;
    this.field = field;
  }

  describe() {
    return this.status ? `${this.status} — ${this.message}` : this.message;
  }
}

export class Api {
  constructor() {
    this.key = sessionStorage.getItem(KEY_ITEM) || "";
  }

  get isRemembered() {
    return sessionStorage.getItem(KEY_ITEM) !== null;
  }

  setKey(key, remember) {
    this.key = key.trim();
    if (remember && this.key) sessionStorage.setItem(KEY_ITEM, this.key);
    else sessionStorage.removeItem(KEY_ITEM);
  }

  headers(hasBody) {
    const headers = { Accept: "application/json, text/event-stream" };
    if (hasBody) headers["Content-Type"] = "application/json";
    if (this.key) headers.Authorization = `Bearer ${this.key}`;
    return headers;
  }

  async fetch(method, path, body, signal) {
    let response;
    try {
      response = await fetch(path, {
        method, signal, cache: "no-store", headers: this.headers(body !== undefined),
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (err) {
      if (err.name === "AbortError") throw err;
      throw new ApiError(0, `the server cannot be reached (${err.message})`);
    }
    if (!response.ok) throw await errorOf(response);
    return response;
  }

  async get(path) {
    return (await this.fetch("GET", path)).json();
  }

  async post(path, body, signal) {
    return (await this.fetch("POST", path, body, signal)).json();
  }

  /** POST with "stream": true; returns the request id and an async iterator of {event, data}. */
  async stream(path, body, signal) {
    const response = await this.fetch("POST", path, { ...body, stream: true }, signal);
    return { requestId: response.headers.get("X-Request-Id"), events: readSse(response.body) };
  }
}

async function errorOf(response) {
  let message = response.statusText || "request failed";
  let field = null;
  try {
    const error = (await response.json()).error;
    if (error) ({ message, field } = error);
  } catch { /* not JSON: keep the status text */ }
  return new ApiError(response.status, message, field);
}

/** Server-Sent Events from a fetch body (EventSource cannot POST). Yields {event, data}, data parsed as JSON. */
export async function* readSse(body) {
  const reader = body.getReader();
  // stream: true keeps a UTF-8 character split across two chunks (every CJK one is 3 bytes) whole.
  const decoder = new TextDecoder("utf-8");
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
      const blocks = buffer.split(/\r?\n\r?\n/);
      buffer = done ? "" : blocks.pop();
      for (const block of blocks) {
        const message = parseBlock(block);
        if (message) yield message;
      }
      if (done) return;
    }
  } finally {
    reader.releaseLock();
  }
}

function parseBlock(block) {
  let event = "message";
  const data = [];
  for (const line of block.split(/\r?\n/)) {
    const colon = line.indexOf(":");
    if (colon <= 0) continue;  // blank, or a ":" comment
    const field = line.slice(0, colon);
    const value = line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") event = value;
    else if (field === "data") data.push(value);
  }
  if (!data.length) return null;
  const raw = data.join("\n");
  try {
    return { event, data: JSON.parse(raw) };
  } catch {
    return { event, data: raw };
  }
}
