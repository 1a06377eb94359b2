import { html, nothing, type TemplateResult } from 'lit-html';
import { allCopiesFailedReason, formatBytes, formatDuration, parseExpectedChecksum, type CreateBackingImageRequest, type SourceType, SOURCE_TYPES } from '@bis/api-client';
import { changed, client, state } from './store.js';
import { alertBox, errorText, progressBar } from './widgets.js';

interface Form {
  name: string;
  sourceType: SourceType;
  url: string;
  file: File | null;
  cloneFrom: string;
  encryption: string;
  backup: string;
  volume: string;
  exportType: string;
  checksum: string;
  minCopies: string;
  nodeSelector: string;
  diskSelector: string;
}

/** The setting the API applies when a request has no minNumberOfCopies: the form starts from the same value. */
const MIN_COPIES_SETTING = 'default-min-number-of-backing-image-copies';
/** Its value once read from the server (undefined until then: the form shows 1 meanwhile). */
let defaultMinCopies: string | undefined;
let defaultMinCopiesLoading = false;

const blank = (): Form => ({ name: '', sourceType: 'download', url: '', file: null, cloneFrom: '', encryption: 'ignore', backup: '', volume: '', exportType: 'raw', checksum: '', minCopies: defaultMinCopies ?? '1', nodeSelector: '', diskSelector: '' });

/** Reads the default min copies once; fills the form unless the user already typed a value. */
function loadDefaultMinCopies(): void {
  if (defaultMinCopies !== undefined || defaultMinCopiesLoading) return;
  defaultMinCopiesLoading = true;
  client.getSetting(MIN_COPIES_SETTING).then(
    (s) => {
      const n = Number(s.value);
      if (!Number.isInteger(n) || n < 1) return;
      defaultMinCopies = String(n);
      if (!touched.has('minCopies')) form = { ...form, minCopies: defaultMinCopies };
      changed();
    },
    () => {
      // Not readable (an older server, a network error): the form keeps 1, which the user sees and can change.
    },
  );
}
let form: Form = blank();
let touched = new Set<string>();
let submitted = false;
let serverError = '';
let submitting = false;

/** The running (or failed) upload: kept so the user can resume it with the same file. */
interface UploadRun {
  name: string;
  file: File;
  offset: number;
  size: number;
  startedAt: number;
  startOffset: number;
  resumes: number;
  error: string;
  done: boolean;
  abort: AbortController;
}
let upload: UploadRun | undefined;

const NAME_RE = /^[a-z0-9][a-z0-9_.-]+$/;
const tags = (s: string): string[] => s.split(',').map((t) => t.trim()).filter(Boolean);

export function validate(f: Form): Record<string, string> {
  const e: Record<string, string> = {};
  if (!f.name) e['name'] = 'A name is required.';
  else if (!NAME_RE.test(f.name)) e['name'] = 'Use at least 2 characters: lowercase letters, digits, “.”, “_” or “-”, starting with a letter or digit.';
  else if (state.images.some((i) => i.name === f.name)) e['name'] = `A backing image named ${f.name} already exists.`;
  if (f.sourceType === 'download') {
    if (!f.url) e['url'] = 'A download URL is required.';
    else {
      try {
        const u = new URL(f.url);
        if (u.protocol !== 'http:' && u.protocol !== 'https:') e['url'] = 'The URL must start with http:// or https://.';
      } catch {
        e['url'] = 'This is not a valid URL.';
      }
    }
  }
  if (f.sourceType === 'upload' && !f.file) e['file'] = 'Choose a file to upload.';
  if (f.sourceType === 'clone' && !f.cloneFrom) e['cloneFrom'] = 'Choose the backing image to clone.';
  if (f.sourceType === 'restore' && !f.backup) e['backup'] = 'Choose a completed backup.';
  if (f.sourceType === 'export-from-volume' && !f.volume) e['volume'] = 'A volume name is required.';
  try {
    parseExpectedChecksum(f.checksum);
  } catch (err) {
    e['checksum'] = errorText(err);
  }
  const n = Number(f.minCopies);
  if (!Number.isInteger(n) || n < 1) e['minCopies'] = 'At least 1 copy.';
  return e;
}

function request(f: Form): CreateBackingImageRequest {
  const parameters: Record<string, string> = {};
  switch (f.sourceType) {
    case 'download':
      parameters['url'] = f.url.trim();
      break;
    case 'clone':
      parameters['backing-image'] = f.cloneFrom;
      parameters['encryption'] = f.encryption;
      break;
    case 'restore': {
      const b = state.backups.find((x) => x.name === f.backup);
      if (b) {
        parameters['backup-url'] = b.url;
        parameters['backup-target-name'] = b.backupTargetName;
      }
      break;
    }
    case 'export-from-volume':
      parameters['volume-name'] = f.volume.trim();
      parameters['export-type'] = f.exportType;
      break;
    case 'upload':
      break; // no parameters: the file is sent once the backing image exists
  }
  return {
    name: f.name,
    sourceType: f.sourceType,
    parameters,
    expectedChecksum: parseExpectedChecksum(f.checksum)?.wire ?? '',
    minNumberOfCopies: Number(f.minCopies),
    nodeSelector: tags(f.nodeSelector),
    diskSelector: tags(f.diskSelector),
    dataEngine: 'v1',
  };
}

async function runUpload(run: UploadRun): Promise<void> {
  run.error = '';
  run.startedAt = Date.now();
  run.startOffset = run.offset;
  const resumedBefore = run.resumes;
  changed();
  try {
    await client.uploadBackingImage(run.name, run.file, {
      signal: run.abort.signal,
      // an upload the server failed (its upload server will not come back) ends with the server's reason at once
      failure: async () => {
        const bi = await client.getBackingImage(run.name, { signal: run.abort.signal }).catch(() => undefined);
        const msg = bi && allCopiesFailedReason(bi);
        if (msg === undefined) return undefined;
        return new Error(`the upload of backing image ${run.name} failed on the server${msg ? `: ${msg}` : ''}; delete it and upload again`);
      },
      onProgress: (p) => {
        run.offset = p.offset;
        run.resumes = resumedBefore + p.resumes;
        changed();
      },
    });
    run.done = true;
    changed();
    location.hash = `#/images/${encodeURIComponent(run.name)}`;
  } catch (err) {
    run.error = errorText(err);
    changed();
  }
}

async function submit(ev: Event): Promise<void> {
  ev.preventDefault();
  submitted = true;
  serverError = '';
  const errs = validate(form);
  if (Object.keys(errs).length) return changed();
  submitting = true;
  changed();
  try {
    const created = await client.createBackingImage(request(form));
    if (form.sourceType === 'upload' && form.file) {
      upload = { name: created.name, file: form.file, offset: 0, size: form.file.size, startedAt: Date.now(), startOffset: 0, resumes: 0, error: '', done: false, abort: new AbortController() };
      // runUpload() shows its own failures on the page.
      void runUpload(upload);
    } else {
      location.hash = `#/images/${encodeURIComponent(created.name)}`;
    }
    form = blank();
    touched = new Set();
    submitted = false;
  } catch (err) {
    serverError = errorText(err);
  } finally {
    submitting = false;
    changed();
  }
}

function field(key: keyof Form, label: string, control: TemplateResult, errs: Record<string, string>, hint?: string): TemplateResult {
  const show = (submitted || touched.has(key)) && errs[key];
  return html`<label class="field ${show ? 'invalid' : ''}" data-field=${key}>
    <span class="label">${label}</span>
    ${control}
    ${show ? html`<span class="error" role="alert">${errs[key]}</span>` : hint ? html`<span class="hint">${hint}</span>` : nothing}
  </label>`;
}

function bind(key: keyof Form) {
  return (e: Event) => {
    const el = e.target as HTMLInputElement;
    (form as unknown as Record<string, unknown>)[key] = key === 'file' ? (el.files?.[0] ?? null) : el.value;
    touched.add(key);
    changed();
  };
}

function uploadPanel(run: UploadRun): TemplateResult {
  const pct = run.size ? (run.offset * 100) / run.size : 0;
  const secs = (Date.now() - run.startedAt) / 1000;
  const rate = secs > 0 ? (run.offset - run.startOffset) / secs : 0;
  const eta = rate > 0 ? (run.size - run.offset) / rate : NaN;
  return html`<section class="panel" id="upload-panel">
    <h2>Uploading ${run.file.name} to ${run.name}</h2>
    ${progressBar(pct, `${formatBytes(run.offset)} / ${formatBytes(run.size)} (${Math.floor(pct)}%)`)}
    <p class="muted">${formatBytes(rate)}/s · ETA ${formatDuration(eta)}${run.resumes ? ` · resumed ${run.resumes}×` : ''}</p>
    ${run.error
      ? html`${alertBox(`Upload interrupted: ${run.error}`)}
          <button class="primary" id="resume-upload" @click=${() => ((run.abort = new AbortController()), void runUpload(run))}>Resume upload</button>`
      : run.done
        ? html`<p>Upload finished.</p>`
        : html`<button @click=${() => run.abort.abort()}>Cancel upload</button>`}
  </section>`;
}

export function createPage(): TemplateResult {
  loadDefaultMinCopies();
  if (upload && !upload.done) return uploadPanel(upload);
  const errs = validate(form);
  const f = form;
  const completed = state.backups.filter((b) => b.state === 'Completed');
  const sourceFields: Record<SourceType, TemplateResult> = {
    download: field('url', 'Download URL', html`<input name="url" type="url" placeholder="https://example.com/image.qcow2" .value=${f.url} @input=${bind('url')} />`, errs, 'http(s) URL of a raw or qcow2 image (gzip, xz and zstd are decompressed).'),
    upload: field('file', 'File', html`<input name="file" type="file" @change=${bind('file')} />`, errs, f.file ? `${f.file.name}, ${formatBytes(f.file.size)}` : 'The upload resumes by itself after a dropped connection.'),
    clone: html`${field('cloneFrom', 'Source backing image', html`<select name="cloneFrom" .value=${f.cloneFrom} @change=${bind('cloneFrom')}><option value="">— choose —</option>${state.images.map((i) => html`<option value=${i.name} ?selected=${i.name === f.cloneFrom}>${i.name}</option>`)}</select>`, errs)}
      ${field('encryption', 'Encryption', html`<select name="encryption" @change=${bind('encryption')}>${['ignore', 'encrypt', 'decrypt'].map((x) => html`<option ?selected=${x === f.encryption}>${x}</option>`)}</select>`, errs)}`,
    restore: field('backup', 'Backup', html`<select name="backup" @change=${bind('backup')}><option value="">— choose —</option>${completed.map((b) => html`<option value=${b.name} ?selected=${b.name === f.backup}>${b.name} (${b.backingImageName}, ${formatBytes(b.size)})</option>`)}</select>`, errs),
    'export-from-volume': html`${field('volume', 'Volume', html`<input name="volume" .value=${f.volume} @input=${bind('volume')} />`, errs)}
      ${field('exportType', 'Export type', html`<select name="exportType" @change=${bind('exportType')}>${['raw', 'qcow2'].map((x) => html`<option ?selected=${x === f.exportType}>${x}</option>`)}</select>`, errs)}`,
  };
  return html`
    <div class="toolbar"><h1>Create backing image</h1></div>
    ${alertBox(serverError, () => ((serverError = ''), changed()))}
    <form class="form" id="create-form" novalidate @submit=${submit}>
      ${field('name', 'Name', html`<input name="name" autocomplete="off" .value=${f.name} @input=${bind('name')} />`, errs)}
      ${field('sourceType', 'Source', html`<select name="sourceType" @change=${bind('sourceType')}>${SOURCE_TYPES.map((t) => html`<option value=${t} ?selected=${t === f.sourceType}>${t}</option>`)}</select>`, errs)}
      ${sourceFields[f.sourceType]}
      ${field('checksum', 'Expected checksum', html`<input name="checksum" autocomplete="off" placeholder="sha512 hex, or sha256:… / sha1:… / md5:…" .value=${f.checksum} @input=${bind('checksum')} />`, errs, 'Optional. A bare value is SHA-512 of the stored file; prefixed SHA-256/SHA-1/MD5 cover the bytes as published.')}
      ${field('minCopies', 'Minimum copies', html`<input name="minCopies" type="number" min="1" .value=${f.minCopies} @input=${bind('minCopies')} />`, errs)}
      ${field('nodeSelector', 'Node selector', html`<input name="nodeSelector" placeholder="tag1, tag2" .value=${f.nodeSelector} @input=${bind('nodeSelector')} />`, errs, 'Node tags that must all be present (comma-separated).')}
      ${field('diskSelector', 'Disk selector', html`<input name="diskSelector" placeholder="ssd" .value=${f.diskSelector} @input=${bind('diskSelector')} />`, errs, 'Disk tags that must all be present (comma-separated).')}
      <div class="actions">
        <button class="primary" type="submit" id="create-submit" ?disabled=${submitting}>${f.sourceType === 'upload' ? 'Create and upload' : 'Create'}</button>
        <a class="button" href="#/">Cancel</a>
      </div>
    </form>
    ${upload?.done === false ? uploadPanel(upload) : nothing}`;
}
