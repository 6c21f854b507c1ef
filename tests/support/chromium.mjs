// Debian's headless Chromium for the Node.js tests and benchmarks that drive the dashboard (tests/browser): the
// browser started with a private profile, its DevTools protocol spoken over a raw WebSocket (no library), and a
// page to drive. Every wait ends with `fail` after the caller's hung-test limit; nothing sleeps.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

// The chromium binary: `wanted` when given and present, else the first `chromium` or `chromium-browser` on PATH;
// null when there is none.
export function findChromium(wanted) {
  if (wanted) return fs.existsSync(wanted) ? wanted : null;
  for (const dir of (process.env.PATH || '').split(':')) {
    for (const name of ['chromium', 'chromium-browser']) {
      const p = path.join(dir, name);
      if (fs.existsSync(p)) return p;
    }
  }
  return null;
}

// Starts headless `bin` with its profile in `profileDir`. Resolves with {process, devtools (the browser's
// WebSocket address)}. `fail(message)` is called if it gives no address within `hungAfterMs`, or if it exits
// while `expected()` says it should not.
export function launchChromium({ bin, profileDir, hungAfterMs, fail, exitExpected = () => false }) {
  const browser = spawn(bin, ['--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage',
                              '--no-first-run', '--no-default-browser-check', '--remote-debugging-port=0',
                              '--window-size=1280,900', `--user-data-dir=${profileDir}`,
                              // Every page draws and runs its timers as a page in view would, even when it is not
                              // the one in front (several dashboards watch at once in the benchmark).
                              '--disable-background-timer-throttling', '--disable-renderer-backgrounding',
                              '--disable-backgrounding-occluded-windows', 'about:blank'],
                        { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  browser.on('exit', (code) => { if (!exitExpected()) fail(`chromium exited (${code}):\n${stderr}`); });
  return new Promise((resolve) => {
    const timer = setTimeout(() => fail(`chromium gave no DevTools address within ${hungAfterMs / 1000} s:\n${stderr}`), hungAfterMs);
    browser.stderr.on('data', (d) => {
      stderr += d.toString();
      const m = stderr.match(/DevTools listening on (ws:\/\/\S+)/);
      if (m) {
        clearTimeout(timer);
        resolve({ process: browser, devtools: m[1] });
      }
    });
  });
}

// One DevTools protocol connection. send() resolves with the result; a protocol error, or no answer within
// `hungAfterMs`, calls `fail`. Events go to every function in `listeners`.
export class Cdp {
  constructor(url, fail, hungAfterMs = 120000) {
    this.fail = fail;
    this.hungAfterMs = hungAfterMs;
    this.ws = new WebSocket(url);
    this.next = 1;
    this.waiting = new Map();
    this.listeners = [];
    this.ws.addEventListener('message', (m) => {
      const msg = JSON.parse(m.data);
      if (msg.id !== undefined && this.waiting.has(msg.id)) {
        const { resolve, method, timer } = this.waiting.get(msg.id);
        clearTimeout(timer);
        this.waiting.delete(msg.id);
        if (msg.error) fail(`CDP ${method}: ${msg.error.message}`);
        resolve(msg.result);
      } else if (msg.method) {
        for (const l of this.listeners) l(msg);
      }
    });
  }
  open() { return new Promise((resolve, reject) => { this.ws.addEventListener('open', resolve); this.ws.addEventListener('error', reject); }); }
  send(method, params = {}, sessionId) {
    const id = this.next++;
    return new Promise((resolve) => {
      const timer = setTimeout(() => this.fail(`CDP ${method}: no answer within ${this.hungAfterMs / 1000} s`), this.hungAfterMs);
      this.waiting.set(id, { resolve, method, timer });
      this.ws.send(JSON.stringify({ id, method, params, ...(sessionId ? { sessionId } : {}) }));
    });
  }
}

// Closes the browser and resolves once its process `browser` has exited (the answer to Browser.close may never
// come: the browser can go first).
export function closeBrowser(cdp, browser) {
  const gone = new Promise((resolve) => { if (browser.exitCode !== null) resolve(); else browser.once('exit', resolve); });
  cdp.ws.send(JSON.stringify({ id: cdp.next++, method: 'Browser.close', params: {} }));
  return gone;
}

// A new window of the browser behind `cdp`, with Runtime, Log and Page enabled: {sessionId, page(method, params),
// evaluate(expression) (awaits promises, returns the value; an exception calls `fail`)}. `ownContext`: the window
// gets a browser context of its own (its own cookies and connections, as another browser would have: Chromium
// opens at most six connections to one server per context, and each dashboard holds one for its event stream).
export async function openPage(cdp, fail, { ownContext = false } = {}) {
  const context = ownContext ? await cdp.send('Target.createBrowserContext') : {};
  const { targetId } = await cdp.send('Target.createTarget', { url: 'about:blank', newWindow: true, ...context });
  const { sessionId } = await cdp.send('Target.attachToTarget', { targetId, flatten: true });
  const page = (method, params) => cdp.send(method, params, sessionId);
  await page('Runtime.enable');
  await page('Log.enable');
  await page('Page.enable');
  async function evaluate(expression) {
    const r = await page('Runtime.evaluate', { expression, returnByValue: true, awaitPromise: true });
    if (r.exceptionDetails) fail(`page: ${expression}: ${r.exceptionDetails.exception?.description ?? r.exceptionDetails.text}`);
    return r.result.value;
  }
  return { sessionId, page, evaluate };
}
