import { html, nothing, type TemplateResult } from 'lit-html';
import { formatBytes } from '@bis/api-client';
import { changed, client, state } from './store.js';
import { alertBox, badge, errorText, progressBar } from './widgets.js';

let error = '';
let notice = '';
let confirmDelete = '';

async function act(msg: string, fn: () => Promise<void>): Promise<void> {
  error = '';
  notice = '';
  try {
    await fn();
    notice = msg;
  } catch (err) {
    error = errorText(err);
  }
  confirmDelete = '';
  changed();
}

export function backupsPage(): TemplateResult {
  return html`
    <div class="toolbar"><h1>Backups</h1></div>
    <section class="panel" id="targets">
      <h2>Backup targets</h2>
      ${state.targets.length === 0
        ? html`<p class="muted">No backup target is configured.</p>`
        : html`<table class="grid"><thead><tr><th>Name</th><th>URL</th><th>Status</th><th>Poll interval</th></tr></thead><tbody>
            ${state.targets.map((t) => html`<tr data-target=${t.name}>
              <td>${t.name}</td><td class="mono">${t.backupTargetURL || '—'}</td>
              <td>${t.available ? html`<span class="badge ok">available</span>` : html`<span class="badge bad" title=${t.message ?? ''}>unavailable</span> <span class="muted">${t.message ?? ''}</span>`}</td>
              <td>${t.pollInterval ?? '—'}</td></tr>`)}
          </tbody></table>`}
    </section>
    ${alertBox(error, () => ((error = ''), changed()))}
    ${notice ? html`<div class="notice" role="status">${notice}</div>` : nothing}
    <table class="grid" id="backups">
      <thead><tr><th>Name</th><th>Backing image</th><th>Target</th><th>Size</th><th>State</th><th>Created</th><th></th></tr></thead>
      <tbody>
        ${state.backups.length === 0
          ? html`<tr><td colspan="7" class="empty">${state.loaded.backups ? 'No backups yet. Back up a backing image from its page.' : 'Loading…'}</td></tr>`
          : state.backups.map((b) => {
              const exists = state.images.some((i) => i.name === b.backingImageName);
              return html`<tr data-backup=${b.name}>
                <td>${b.name}</td>
                <td>${exists ? html`<a href="#/images/${encodeURIComponent(b.backingImageName)}">${b.backingImageName}</a>` : b.backingImageName}</td>
                <td>${b.backupTargetName}</td>
                <td>${b.size ? formatBytes(b.size) : '—'}</td>
                <td>${badge(b.state)} ${b.state === 'InProgress' ? progressBar(b.progress) : nothing} ${b.error ? html`<span class="icon info" title=${b.error}>ⓘ</span>` : nothing}</td>
                <td>${b.created ? new Date(b.created).toLocaleString() : '—'}</td>
                <td><div class="row-actions">
                  <button class="restore" ?disabled=${b.state !== 'Completed' || exists} title=${exists ? `backing image ${b.backingImageName} exists; delete it to restore` : 'create the backing image from this backup'}
                    @click=${() => act(`Restoring ${b.backingImageName} from ${b.name}.`, () => client.restoreBackup(b.name))}>Restore</button>
                  ${confirmDelete === b.name
                    ? html`<button class="danger confirm-delete" @click=${() => act(`Deleted backup ${b.name}.`, () => client.deleteBackup(b.name))}>Really delete</button>
                        <button @click=${() => ((confirmDelete = ''), changed())}>Cancel</button>`
                    : html`<button class="danger delete" @click=${() => ((confirmDelete = b.name), changed())}>Delete</button>`}
                </div></td>
              </tr>`;
            })}
      </tbody>
    </table>`;
}
