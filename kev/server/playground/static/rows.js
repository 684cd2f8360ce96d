// The question rows: add, remove, paste several lines, Enter for a new row (Shift+Enter: a line break);
// each row may carry its own timeout_ms.

export class Rows {
  constructor(list, template) {
    this.list = list;
    this.template = template;
  }

  get rows() {
    return [...this.list.children];
  }

  /** A new row holding `text`, after `after` (default: at the end). */
  add(text, { after = null, focus = false } = {}) {
    const row = this.template.content.firstElementChild.cloneNode(true);
    const input = row.querySelector(".q-text");
    input.value = text;
    input.addEventListener("paste", (event) => this.splitPaste(event, row));
    input.addEventListener("keydown", (event) => {
      const plain = !event.ctrlKey && !event.metaKey && !event.shiftKey && !event.altKey && !event.isComposing;
      if (event.key === "Enter" && plain) {  // Enter adds a row (Ctrl+Enter sends); an IME's Enter is left alone
        event.preventDefault();
        this.add("", { after: row, focus: true });
      }
    });
    row.querySelector(".q-remove").addEventListener("click", () => this.remove(row));
    if (after) after.after(row);
    else this.list.append(row);
    this.renumber();
    if (focus) input.focus();
    return row;
  }

  remove(row) {
    const rows = this.rows;
    const at = rows.indexOf(row);
    row.remove();
    this.renumber();
    const next = this.rows[Math.min(at, this.rows.length - 1)];
    (next?.querySelector(".q-text") || document.getElementById("add-row")).focus();
  }

  /** Pasting several lines fills this row with the first and adds a row for each other line. */
  splitPaste(event, row) {
    const text = event.clipboardData?.getData("text") || "";
    const lines = text.split(/\r?\n/).map((line) => line.trim()).filter(Boolean);
    if (lines.length < 2) return;
    event.preventDefault();
    event.target.setRangeText(lines[0], event.target.selectionStart, event.target.selectionEnd, "end");
    let last = row;
    for (const line of lines.slice(1)) last = this.add(line, { after: last });
    last.querySelector(".q-text").focus();
  }

  renumber() {
    this.rows.forEach((row, i) => {
      row.querySelector(".row-number").textContent = `Question ${i + 1}`;
      row.querySelector(".row-timeout-name").textContent = `timeout_ms of question ${i + 1}`;
      row.querySelector(".q-remove").setAttribute("aria-label", `Remove question ${i + 1}`);
    });
  }

  /** The non-empty rows: [{text, timeoutMs}] (timeoutMs undefined when the row has none). */
  read() {
    return this.rows.map((row) => {
      const timeout = row.querySelector(".q-timeout").value.trim();
      return { text: row.querySelector(".q-text").value.trim(), timeoutMs: timeout === "" ? undefined : Number(timeout) };
    }).filter((q) => q.text);
  }

  focusFirst() {
    const input = this.rows[0]?.querySelector(".q-text");
    (input || document.getElementById("add-row")).focus();
  }
}
