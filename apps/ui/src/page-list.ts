import { html, nothing, type TemplateResult } from 'lit-html';
import { describeCopies, describeSource, formatBytes, summariseCopies, type BackingImage } from '@bis/api-client';
import { changed, client, state } from './store.js';
import { alertBox, badge, errorText, progressBar } from './widgets.js';

const selected = new Set<string>();
let confirming = false;
let error = '';
let busy = false;

async function deleteSelected(): Promise<void> {
  busy = true;
  error = '';
  changed();
  const names = [...selected];
  const results = await Promise.allSettled(names.map((n) => client.deleteBackingImage(n)));
  const failures = results.map((r, i) => (r.status === 'rejected' ? `${names[i]}: ${errorText(r.reason)}` : '')).filter(Boolean);
  error = failures.join('; ');
  for (const [i, r] of results.entries()) if (r.status === 'fulfilled') selected.delete(names[i]);
  confirming = false;
  busy = false;
  changed();
}

/**
 * Why an image is not (all) ready, short: the message of a failed copy first, else of any copy with one, cut to one
 * line. The detail page shows it in full.
 */
export function shortReason(bi: BackingImage, max = 110, shortenHex = true): string {
  const files = Object.values(bi.diskFileStatusMap ?? {});
  const failed = files.find((f) => (f.state === 'failed' || f.state === 'failed-and-cleanup') && f.message);
  const any = failed ?? files.find((f) => f.state !== 'ready' && f.message && f.message !== 'File processing is not started');
  // long hex (checksums) shortened to their first 8 digits: the words around them are what says why
  const m = (any?.message ?? '').replace(/\s+/g, ' ').replace(/\b[0-9a-f]{32,}\b/g, (h) => (shortenHex ? `${h.slice(0, 8)}…` : h)).trim();
  return m.length > max ? `${m.slice(0, max - 1)}…` : m;
}

export function listPage(): TemplateResult {
  for (const n of selected) if (!state.images.some((i) => i.name === n)) selected.delete(n);
  const rows = state.images;
  const allChecked = rows.length > 0 && rows.every((r) => selected.has(r.name));
  return html`
    <div class="toolbar">
      <h1>Backing images</h1>
      <span class="spacer"></span>
      ${selected.size
        ? confirming
          ? html`<span class="confirm">Delete ${selected.size} backing image${selected.size > 1 ? 's' : ''}?
              <button class="danger" id="confirm-delete" ?disabled=${busy} @click=${deleteSelected}>Delete</button>
              <button @click=${() => ((confirming = false), changed())}>Cancel</button></span>`
          : html`<button class="danger" id="delete-selected" @click=${() => ((confirming = true), changed())}>Delete selected (${selected.size})</button>`
        : nothing}
      <a class="button primary" href="#/create" id="create-link">Create backing image</a>
    </div>
    ${alertBox(error, () => ((error = ''), changed()))}
    <table class="grid" id="images">
      <thead>
        <tr>
          <th class="check"><input type="checkbox" aria-label="select all" .checked=${allChecked} @change=${(e: Event) => {
            const on = (e.target as HTMLInputElement).checked;
            for (const r of rows) on ? selected.add(r.name) : selected.delete(r.name);
            changed();
          }} /></th>
          <th>Name</th><th>Size</th><th>Virtual size</th><th>Created from</th><th>State</th><th>Progress</th>
        </tr>
      </thead>
      <tbody>
        ${rows.length === 0
          ? html`<tr><td colspan="7" class="empty">${state.loaded.images ? 'No backing images yet.' : 'Loading…'}</td></tr>`
          : rows.map((bi) => {
              const s = summariseCopies(bi);
              return html`<tr data-name=${bi.name} class=${s.deleting ? 'deleting' : ''}>
                <td class="check"><input type="checkbox" aria-label="select ${bi.name}" .checked=${selected.has(bi.name)} @change=${(e: Event) => {
                  (e.target as HTMLInputElement).checked ? selected.add(bi.name) : selected.delete(bi.name);
                  changed();
                }} /></td>
                <td class="name">
                  ${s.deleting ? html`<span class="icon" title="being deleted" data-icon="deleting">🗑</span>` : nothing}
                  ${s.allFailed ? html`<span class="icon bad" title="all copies failed" data-icon="all-failed">⚠</span>` : nothing}
                  <a href="#/images/${encodeURIComponent(bi.name)}">${bi.name}</a>
                </td>
                <td>${bi.size ? formatBytes(bi.size) : '—'}</td>
                <td>${bi.virtualSize ? formatBytes(bi.virtualSize) : '—'}</td>
                <td class="source" title=${describeSource(bi)}>${describeSource(bi)}</td>
                <td>${badge(s.phase)} <span class="muted">${describeCopies(s)}</span>
                  ${shortReason(bi) ? html`<div class="reason" data-reason title=${shortReason(bi, 2000, false)}>${shortReason(bi)}</div>` : nothing}</td>
                <td>${s.total && s.ready < s.total && !s.allFailed ? progressBar(s.progress) : s.ready && s.ready === s.total ? progressBar(100, 'done') : '—'}</td>
              </tr>`;
            })}
      </tbody>
    </table>`;
}
