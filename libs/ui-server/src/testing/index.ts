export { CHROMIUM, browserMissing, describeWithBrowser, launchBrowser } from './browser.js';
