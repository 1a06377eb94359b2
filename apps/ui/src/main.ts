import { html, render } from 'lit-html';
import { backupsPage } from './page-backups.js';
import { createPage } from './page-create.js';
import { detailPage } from './page-detail.js';
import { listPage } from './page-list.js';
import { targetsPage } from './page-targets.js';
import { tokenForm } from './page-token.js';
import { changed, onChange, restartLiveUpdates, state } from './store.js';
import './styles.css';

function route(): { page: string; arg: string } {
  const h = location.hash.replace(/^#\/?/, '');
  const [page, ...rest] = h.split('/');
  return { page: page || 'images', arg: decodeURIComponent(rest.join('/')) };
}

function view() {
  const r = route();
  const body = state.auth.required
    ? tokenForm()
    : r.page === 'create' ? createPage() : r.page === 'images' && r.arg ? detailPage(r.arg) : r.page === 'backups' ? backupsPage() : r.page === 'targets' ? targetsPage() : listPage();
  const nav = (href: string, label: string, active: boolean) => html`<a href=${href} class=${active ? 'active' : ''}>${label}</a>`;
  return html`
    <header>
      <span class="brand">Backing images</span>
      <nav>
        ${nav('#/', 'Images', r.page === 'images' || r.page === '')}
        ${nav('#/create', 'Create', r.page === 'create')}
        ${nav('#/backups', 'Backups', r.page === 'backups')}
        ${nav('#/targets', 'Targets', r.page === 'targets')}
      </nav>
      <span class="spacer"></span>
      <span class="live ${state.live ? 'on' : 'off'}" id="live" title=${state.live ? 'live updates connected' : 'live updates disconnected'}>${state.live ? '● live' : '○ offline'}</span>
    </header>
    ${state.banner ? html`<div class="banner">${state.banner}</div>` : ''}
    <main data-page=${state.auth.required ? 'token' : r.page}>${body}</main>`;
}

const root = document.getElementById('app')!;
onChange(() => render(view(), root));
window.addEventListener('hashchange', changed);
// Progress rates and ETAs change with time as well as with data.
setInterval(changed, 1000);
restartLiveUpdates();
changed();
