import { html, nothing, type TemplateResult } from 'lit-html';
import { copiesShortfall, describeCopies, describeSource, formatBytes, summariseCopies, type BackingImage, type BisEvent } from '@bis/api-client';
import { changed, client, diskLocation, diskScrub, imageNamed, state } from './store.js';
import { alertBox, badge, errorText, progressBar } from './widgets.js';

interface DetailState {
  name: string;
  selected: Set<string>;
  minCopies: string;
  error: string;
  notice: string;
  busy: boolean;
}
let d: DetailState = { name: '', selected: new Set(), minCopies: '', error: '', notice: '', busy: false };

/** The events of the image shown (`/v1/events`), refreshed while the page is shown. */
const ev: { name: string; list: BisEvent[] | undefined; error: string; at: number; loading: boolean } = { name: '', list: undefined, error: '', at: 0, loading: false };
const EVENTS_REFRESH_MS = 2000;

function refreshEvents(name: string): void {
  if (ev.name !== name) Object.assign(ev, { name, list: undefined, error: '', at: 0, loading: false });
  if (ev.loading || Date.now() - ev.at < EVENTS_REFRESH_MS) return;
  ev.loading = true;
  client
    .listEvents({ kind: 'BackingImage', name })
    .then(
      (list) => {
        if (ev.name === name) Object.assign(ev, { list, error: '' });
      },
      (err: unknown) => {
        if (ev.name === name) ev.error = errorText(err);
      },
    )
    .finally(() => {
      ev.loading = false;
      ev.at = Date.now();
      changed();
      // keep them current while this page is shown
      setTimeout(() => {
        if (location.hash === `#/images/${encodeURIComponent(name)}`) changed();
      }, EVENTS_REFRESH_MS);
    });
}

/** kubectl's age: `45s`, `12m`, `3h`, `5d`. */
function age(iso: string): string {
  const s = Math.max(0, Math.floor((Date.now() - Date.parse(iso)) / 1000));
  if (!Number.isFinite(s)) return '—';
  return s < 120 ? `${s}s` : s < 7200 ? `${Math.floor(s / 60)}m` : s < 172800 ? `${Math.floor(s / 3600)}h` : `${Math.floor(s / 86400)}d`;
}

function eventsPanel(): TemplateResult {
  const list = ev.list;
  return html`<section class="panel">
    <h2>Events</h2>
    ${ev.error ? html`<p class="muted" id="events-error">Events cannot be shown: ${ev.error}</p>` : nothing}
    ${list === undefined
      ? html`<p class="muted">Loading…</p>`
      : list.length === 0
        ? html`<p class="muted" id="events-empty">No events.</p>`
        : html`<table class="grid" id="events">
            <thead><tr><th>Type</th><th>Reason</th><th>Age</th><th>From</th><th>Message</th></tr></thead>
            <tbody>${[...list].reverse().map(
              (e) => html`<tr data-reason=${e.reason} data-type=${e.eventType} class=${e.eventType === 'Warning' ? 'warning' : ''}>
                <td>${e.eventType}</td><td>${e.reason}</td>
                <td title=${e.lastTimestamp}>${age(e.lastTimestamp)}${e.count > 1 ? ` (×${e.count} over ${age(e.firstTimestamp)})` : ''}</td>
                <td class="muted">${e.source}</td><td class="wrap message">${e.message}</td>
              </tr>`,
            )}</tbody>
          </table>`}
  </section>`;
}

async function act(what: string, fn: () => Promise<unknown>): Promise<void> {
  d.busy = true;
  d.error = '';
  d.notice = '';
  changed();
  try {
    await fn();
    d.notice = what;
  } catch (err) {
    d.error = errorText(err);
  } finally {
    d.busy = false;
    changed();
  }
}

/** How long ago an RFC 3339 time was, shortly (`40s ago`, `5m ago`, `2h ago`, `3d ago`). */
function ago(time: string): string {
  const s = Math.max(0, Math.floor((Date.now() - Date.parse(time)) / 1000));
  if (!Number.isFinite(s)) return time;
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 48 * 3600) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
}

/** The disk's last background scrub under its name: `scrub: ok 2h ago`, `scrub: corrupted 5m ago` (message in the title). */
function scrubNote(uuid: string): TemplateResult | typeof nothing {
  const s = diskScrub(uuid);
  if (!s) return nothing;
  const result = s.lastScrubResult || 'none';
  const text = s.lastScrubTime && s.lastScrubResult ? `scrub: ${s.lastScrubResult} ${ago(s.lastScrubTime)}` : 'scrub: not yet';
  const title = [s.lastScrubTime ? `last scrub ${s.lastScrubTime}, ${s.lastScrubFiles} copies verified` : 'no scrub pass yet', s.lastScrubMessage, s.scrubbing ? `scrubbing ${s.scrubbing}` : '']
    .filter(Boolean)
    .join('\n');
  return html`<br /><small class="scrub ${result === 'ok' || result === 'none' ? '' : 'bad'}" data-scrub=${result} title=${title}>${text}</small>`;
}

function diskRows(bi: BackingImage): TemplateResult[] {
  return Object.entries(bi.diskFileStatusMap)
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([uuid, f]) => {
      const loc = diskLocation(uuid);
      const active = f.state === 'in-progress' || f.state === 'starting' || f.state === 'pending';
      return html`<tr data-disk=${uuid}>
        <td class="check"><input type="checkbox" aria-label="select disk ${uuid}" .checked=${d.selected.has(uuid)} @change=${(e: Event) => {
          (e.target as HTMLInputElement).checked ? d.selected.add(uuid) : d.selected.delete(uuid);
          changed();
        }} /></td>
        <td>${loc?.node ?? '—'}</td>
        <td title=${loc?.path ?? ''}>${loc?.disk ?? '—'}${scrubNote(uuid)}</td>
        <td class="mono">${uuid}</td>
        <td>${badge(f.state)}</td>
        <td>${active ? progressBar(f.progress) : f.state === 'ready' ? progressBar(100, 'done') : '—'}</td>
        <td class="retry">${f.retryCount ? html`<span data-retries=${f.retryCount}>${f.retryCount} failed</span>` : '—'}${f.nextRetryAt
          ? html`<br /><span class="muted" data-next-retry=${f.nextRetryAt} title=${f.nextRetryAt}>next ${new Date(f.nextRetryAt).toLocaleTimeString()}</span>`
          : nothing}</td>
        <td class="wrap message" data-message=${f.message}>${f.message || '—'}</td>
      </tr>`;
    });
}

export function detailPage(name: string): TemplateResult {
  if (d.name !== name) d = { name, selected: new Set(), minCopies: '', error: '', notice: '', busy: false };
  const bi = imageNamed(name);
  if (!bi) {
    return html`<div class="toolbar"><h1>${name}</h1></div>
      <p class="empty">${state.loaded.images ? html`Backing image ${name} does not exist (any more). <a href="#/">Back to the list</a>` : 'Loading…'}</p>`;
  }
  for (const u of d.selected) if (!(u in bi.diskFileStatusMap)) d.selected.delete(u);
  refreshEvents(name);
  const s = summariseCopies(bi);
  const params = Object.entries(bi.parameters ?? {});
  return html`
    <div class="toolbar">
      <h1>${s.deleting ? html`<span class="icon" title="being deleted">🗑</span>` : nothing}${bi.name}</h1>
      ${badge(s.phase)}
      <span class="spacer"></span>
      <button id="backup" ?disabled=${d.busy || s.ready === 0} @click=${() => act(`Backup of ${bi.name} started.`, () => client.backupBackingImage(bi.name))}>Back up</button>
      <a class="button ${s.ready ? '' : 'disabled'}" id="download" href=${s.ready ? client.downloadUrl(bi.name) : nothing} download=${`${bi.name}.gz`} aria-disabled=${s.ready ? 'false' : 'true'} title="the image file, gzip-compressed (as Longhorn serves it)">Download (.gz)</a>
    </div>
    ${alertBox(d.error, () => ((d.error = ''), changed()))}
    ${d.notice ? html`<div class="notice" role="status">${d.notice}</div>` : nothing}
    ${copiesShortfall(bi) ? html`<div class="alert warning" id="copies-warning" role="status">${copiesShortfall(bi)!.message}</div>` : nothing}
    <div class="cards">
      <section class="panel">
        <h2>Image</h2>
        <dl class="props">
          <dt>Created from</dt><dd>${describeSource(bi)}</dd>
          <dt>Source type</dt><dd>${bi.sourceType}</dd>
          <dt>UUID</dt><dd class="mono">${bi.uuid || '—'}</dd>
          <dt>Size</dt><dd>${bi.size ? `${formatBytes(bi.size)} (${bi.size} bytes)` : '—'}</dd>
          <dt>Virtual size</dt><dd>${bi.virtualSize ? `${formatBytes(bi.virtualSize)} (${bi.virtualSize} bytes)` : '—'}</dd>
          <dt>Copies</dt><dd>${describeCopies(s)}</dd>
          <dt>Node selector</dt><dd>${bi.nodeSelector?.length ? bi.nodeSelector.join(', ') : 'any'}</dd>
          <dt>Disk selector</dt><dd>${bi.diskSelector?.length ? bi.diskSelector.join(', ') : 'any'}</dd>
        </dl>
      </section>
      <section class="panel">
        <h2>Checksums</h2>
        <dl class="props">
          <dt>Expected</dt><dd class="mono wrap" id="expected-checksum">${bi.expectedChecksum || '—'}</dd>
          <dt>Current (SHA-512)</dt><dd class="mono wrap" id="current-checksum">${bi.currentChecksum || '—'}</dd>
        </dl>
        <h2>Parameters</h2>
        ${params.length ? html`<dl class="props">${params.map(([k, v]) => html`<dt>${k}</dt><dd class="wrap">${v}</dd>`)}</dl>` : html`<p class="muted">none</p>`}
      </section>
    </div>
    <section class="panel">
      <div class="toolbar small">
        <h2>Copies on disks</h2>
        <span class="spacer"></span>
        <label class="inline">Minimum copies
          <input id="min-copies" type="number" min="1" .value=${d.minCopies || String(bi.minNumberOfCopies)} @input=${(e: Event) => ((d.minCopies = (e.target as HTMLInputElement).value), changed())} />
        </label>
        <button id="update-min-copies" ?disabled=${d.busy || !d.minCopies || d.minCopies === String(bi.minNumberOfCopies)}
          @click=${() => act(`Minimum copies set to ${d.minCopies}.`, async () => {
            await client.updateMinNumberOfCopies(bi.name, Number(d.minCopies));
            d.minCopies = '';
          })}>Update</button>
        <button class="danger" id="cleanup-disks" ?disabled=${d.busy || d.selected.size === 0}
          @click=${() => act(`Cleaning up ${d.selected.size} cop${d.selected.size > 1 ? 'ies' : 'y'}.`, async () => {
            await client.cleanupBackingImage(bi.name, [...d.selected]);
            d.selected.clear();
          })}>Clean up selected disks${d.selected.size ? ` (${d.selected.size})` : ''}</button>
      </div>
      <table class="grid" id="disks">
        <thead><tr><th class="check"></th><th>Node</th><th>Disk</th><th>Disk UUID</th><th>State</th><th>Progress</th><th>Retries</th><th>Message</th></tr></thead>
        <tbody>${Object.keys(bi.diskFileStatusMap).length ? diskRows(bi) : html`<tr><td colspan="8" class="empty">No copies yet.</td></tr>`}</tbody>
      </table>
    </section>
    ${eventsPanel()}`;
}
