import { html, nothing, type TemplateResult } from 'lit-html';
import type { BackupTarget, SecretInfo } from '@bis/api-client';
import { changed, client, state } from './store.js';
import { alertBox, errorText } from './widgets.js';

/** The backup targets: URL, availability and the target's message, and a form to change URL, secret and poll interval. */
interface Form {
  url: string;
  secret: string;
  pollInterval: string;
}
let editing = '';
let form: Form = { url: '', secret: '', pollInterval: '' };
let secrets: SecretInfo[] = [];
let error = '';
let notice = '';
let busy = false;

async function loadSecrets(): Promise<void> {
  try {
    secrets = await client.listSecrets();
  } catch {
    secrets = []; // Kubernetes mode has no /v1/secrets: the secret is typed by name.
  }
  changed();
}

function startEdit(t: BackupTarget): void {
  editing = t.name;
  form = { url: t.backupTargetURL ?? '', secret: t.credentialSecret ?? '', pollInterval: t.pollInterval ?? '' };
  error = '';
  notice = '';
  // loadSecrets() cannot reject: a failure means no secret list.
  void loadSecrets();
  changed();
}

async function save(name: string): Promise<void> {
  busy = true;
  error = '';
  notice = '';
  changed();
  try {
    await client.updateBackupTarget(name, { backupTargetURL: form.url.trim(), credentialSecret: form.secret.trim(), pollInterval: form.pollInterval.trim() });
    state.targets = await client.listBackupTargets();
    editing = '';
    notice = `Saved backup target ${name}.`;
  } catch (err) {
    error = errorText(err);
  } finally {
    busy = false;
    changed();
  }
}

const input = (key: keyof Form) => (e: Event) => {
  form[key] = (e.target as HTMLInputElement).value;
};

function editRow(t: BackupTarget): TemplateResult {
  const names = secrets.map((s) => s.name);
  return html`<tr class="edit" data-edit=${t.name}><td colspan="6">
    <form class="target-form" @submit=${(e: Event) => (e.preventDefault(), void save(t.name))}>
      <label>URL <input name="url" class="mono" .value=${form.url} @input=${input('url')} placeholder="s3://bucket@region/path, nfs://host:/export, vfs:///dir" size="48" /></label>
      <label>Credential secret <input name="secret" .value=${form.secret} @input=${input('secret')} list="secret-names" placeholder="none" /></label>
      <datalist id="secret-names">${names.map((n) => html`<option value=${n}></option>`)}</datalist>
      <label>Poll interval <input name="pollInterval" .value=${form.pollInterval} @input=${input('pollInterval')} placeholder="5m0s" size="8" /></label>
      <button type="submit" class="primary save" ?disabled=${busy}>Save</button>
      <button type="button" class="cancel" @click=${() => ((editing = ''), changed())}>Cancel</button>
    </form>
  </td></tr>`;
}

export function targetsPage(): TemplateResult {
  return html`
    <div class="toolbar"><h1>Backup targets</h1></div>
    ${alertBox(error, () => ((error = ''), changed()))}
    ${notice ? html`<div class="notice" role="status">${notice}</div>` : nothing}
    <table class="grid" id="target-list">
      <thead><tr><th>Name</th><th>URL</th><th>Credential secret</th><th>Poll interval</th><th>Status</th><th></th></tr></thead>
      <tbody>
        ${state.targets.length === 0
          ? html`<tr><td colspan="6" class="empty">No backup target is configured.</td></tr>`
          : state.targets.map(
              (t) => html`<tr data-target=${t.name}>
                  <td>${t.name}${t.default ? html` <span class="muted">(default)</span>` : nothing}</td>
                  <td class="mono url">${t.backupTargetURL || '—'}</td>
                  <td class="secret">${t.credentialSecret || '—'}</td>
                  <td class="poll">${t.pollInterval || '—'}</td>
                  <td class="status">${t.available
                    ? html`<span class="badge ok">available</span>`
                    : html`<span class="badge bad">unavailable</span> <span class="message">${t.message ?? ''}</span>`}</td>
                  <td><div class="row-actions"><button class="edit" @click=${() => startEdit(t)} ?disabled=${editing === t.name}>Edit</button></div></td>
                </tr>
                ${editing === t.name ? editRow(t) : nothing}`,
            )}
      </tbody>
    </table>`;
}
