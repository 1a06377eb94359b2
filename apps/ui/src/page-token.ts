import { html, nothing, type TemplateResult } from 'lit-html';
import { signIn, state } from './store.js';

let busy = false;

async function submit(e: Event): Promise<void> {
  e.preventDefault();
  const form = e.target as HTMLFormElement;
  const input = form.elements.namedItem('token') as HTMLInputElement;
  busy = true;
  try {
    await signIn(input.value);
  } finally {
    busy = false;
    input.value = '';
  }
}

/**
 * Shown instead of the page when the API answers 401: the REST token (`controller-manager --auth-token-file`), kept in
 * this tab's sessionStorage once the API accepts it.
 */
export function tokenForm(): TemplateResult {
  const error = state.auth.error;
  return html`
    <h1>API token required</h1>
    <form class="form token-form" id="token-form" @submit=${submit}>
      <p>This server requires a token for its API (the content of the controller's <code>--auth-token-file</code>). It is kept for this browser tab's session only.</p>
      <div class="field" data-field="token">
        <label for="token-input">Token</label>
        <input id="token-input" name="token" type="password" autocomplete="current-password" required ?disabled=${busy} />
        ${error ? html`<span class="error" id="token-error" role="alert">${error}</span>` : nothing}
      </div>
      <div><button type="submit" id="token-submit" class="primary" ?disabled=${busy}>Sign in</button></div>
    </form>`;
}
