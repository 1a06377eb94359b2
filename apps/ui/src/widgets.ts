import { html, nothing, type TemplateResult } from 'lit-html';
import { ApiClientError } from '@bis/api-client';

export function progressBar(pct: number, label?: string): TemplateResult {
  const p = Math.max(0, Math.min(100, Math.round(pct)));
  return html`<div class="progress" role="progressbar" aria-valuenow=${p} aria-valuemin="0" aria-valuemax="100" title=${label ?? `${p}%`}>
    <div class="progress-fill" style="width:${p}%"></div><span class="progress-text">${label ?? `${p}%`}</span>
  </div>`;
}

const STATE_CLASS: Record<string, string> = {
  ready: 'ok',
  'ready-for-transfer': 'ok',
  Completed: 'ok',
  'in-progress': 'busy',
  starting: 'busy',
  InProgress: 'busy',
  Pending: 'wait',
  pending: 'wait',
  failed: 'bad',
  'failed-and-cleanup': 'bad',
  Error: 'bad',
  deleting: 'wait',
};

export function badge(stateName: string): TemplateResult {
  const text = stateName || 'not started';
  return html`<span class="badge ${STATE_CLASS[stateName] ?? 'wait'}" data-state=${text}>${text}</span>`;
}

export function errorText(err: unknown): string {
  if (err instanceof ApiClientError) return err.message;
  return err instanceof Error ? err.message : String(err);
}

export function alertBox(message: string, onClose?: () => void): TemplateResult | typeof nothing {
  if (!message) return nothing;
  return html`<div class="alert" role="alert"><span>${message}</span>${onClose ? html`<button class="link" @click=${onClose} aria-label="dismiss">×</button>` : nothing}</div>`;
}

export function shortHash(h: string): string {
  return h ? `${h.slice(0, 16)}…${h.slice(-8)}` : '—';
}
