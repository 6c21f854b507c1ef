// The dashboard in a real browser (docs/dashboard.md): Debian's headless Chromium, driven over the DevTools
// protocol (raw CDP on a WebSocket, no library), against the real accelpool-manager with a real accelpool-agent,
// and guests that are the real accelpool-run. Every wait is on a condition (a DOM state, an API answer, a process
// exit) with one generous limit that only fails a hung test; nothing sleeps.
//
// Usage: node --experimental-websocket dashboard_test.mjs --manager BIN --agent BIN --run BIN --work DIR
//        [--chromium BIN] [--screenshots DIR]
//   --screenshots: where the PNGs of the main views go (default: WORK/screenshots); docs/dashboard/ holds a run's.
import { spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

import { Cdp, closeBrowser, findChromium, launchChromium, openPage } from '../support/chromium.mjs';
import { Guest } from '../support/guest_client.mjs';
import { deadline, loopbackConfig, request, startManager, waiter } from '../support/manager_process.mjs';

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, a, i, all) => (a.startsWith('--') ? [...pairs, [a.slice(2), all[i + 1]]] : pairs), []));
for (const key of ['manager', 'agent', 'run', 'work']) {
  if (!args[key]) {
    console.error(`dashboard: missing --${key}`);
    process.exit(2);
  }
}
const kHungAfterMs = 120000;
const kAgentToken = 'dashboard-agent-token-0123456789';
const kTtlS = 60;      // [leases] ttl_s: guests heartbeat at least every third of it
const kFiller = 2000;  // requests tenant u queues first in part 4b: as many as the stream looks through for a tenant's
const kQueued = 130;   // requests each of t and u queue then, in turns
const kPageRows = 100; // the queue view's rows a page
const children = [];
let stopping = false;
process.on('exit', () => children.forEach((c) => c.kill('SIGKILL')));

function fail(message) {
  console.error(`dashboard: FAIL: ${message}`);
  process.exit(1);
}
const step = (what) => console.log(`dashboard: ${what}`);

const chromium = findChromium(args.chromium);
if (!chromium) fail('no chromium on PATH: install Debian\'s chromium package (scripts/setup.sh does); this test cannot run without it');
const eventually = waiter(kHungAfterMs, fail);
const within = deadline(kHungAfterMs, fail);
if (typeof WebSocket !== 'function') fail('this Node.js has no WebSocket: run it with --experimental-websocket (Node 20) or Node 22+');

// --- the pool: a manager (one static host) and a host agent with two simulated FPGAs --------------------------------
fs.rmSync(args.work, { recursive: true, force: true });
fs.mkdirSync(args.work, { recursive: true });
const shots = args.screenshots ?? path.join(args.work, 'screenshots');
fs.mkdirSync(shots, { recursive: true });
const log = (name) => fs.openSync(path.join(args.work, name), 'a');
const managerData = path.join(args.work, 'manager');
const started = await startManager({
  bin: args.manager, work: args.work, dataDir: managerData, eventually, fail,
  config: loopbackConfig({ agentToken: kAgentToken, kind: 'asic', count: 1, tenants: ['t', 'u'],
                           leases: `ttl_s = ${kTtlS}\nrevoke_grace_s = 5\n` }),
  onExit: (code, text) => { if (!stopping) fail(`accelpool-manager exited (${code}):\n${text}`); },
});
const manager = started.process;
children.push(manager);
const { endpoints, tokenOf } = started;
const admin = tokenOf('admin token');
const tenantT = tokenOf('guest token for tenant t');
const tenantU = tokenOf('guest token for tenant u');
const adminPort = Number(endpoints.admin.split(':').pop());
const base = endpoints.admin;
const api = (method, target, body) => request(adminPort, method, target, { token: admin, body });

fs.writeFileSync(path.join(args.work, 'agent.toml'), `[agent]
manager = "${endpoints.agents}"
token = "${kAgentToken}"
host = "agent-a"
heartbeat_interval_ms = 200
[backends.sim]
devices = "fpga:sim-u250:2"
program_base_ms = 5
attach = "network"
`);
const agent = spawn(args.agent, ['--config', path.join(args.work, 'agent.toml')], { stdio: ['ignore', log('agent.log'), log('agent.log')] });
children.push(agent);
agent.on('exit', (code) => { if (!stopping) fail(`accelpool-agent exited (${code})`); });
const agentDevices = await eventually('the agent\'s devices join the pool', async () => {
  const r = await api('GET', '/v1/devices?host=agent-a');
  const names = r.json?.devices?.filter((d) => d.state === 'free').map((d) => d.name) ?? [];
  return names.length === 2 ? names.sort() : null;
});
step(`manager on ${base}, agent-a with ${agentDevices.join(', ')}`);

// --- Chromium and the DevTools protocol ---------------------------------------------------------------------------
const { process: browser, devtools } = await launchChromium({
  bin: chromium, profileDir: path.join(args.work, 'profile'), hungAfterMs: kHungAfterMs, fail, exitExpected: () => stopping,
});
children.push(browser);
const cdp = new Cdp(devtools, fail, kHungAfterMs);
await cdp.open();
const { sessionId, page, evaluate } = await openPage(cdp, fail);
// Whatever the page logs as an error (a CSP refusal, an exception) fails the test at the end.
const pageErrors = [];
cdp.listeners.push((msg) => {
  if (msg.sessionId !== sessionId) return;
  if (msg.method === 'Runtime.exceptionThrown') pageErrors.push(msg.params.exceptionDetails.exception?.description ?? msg.params.exceptionDetails.text);
  if (msg.method === 'Log.entryAdded' && msg.params.entry.level === 'error' && !/the server responded with a status of 4\d\d/.test(msg.params.entry.text)) {
    pageErrors.push(msg.params.entry.text);
  }
});

const waitPage = (what, expression) => eventually(what, () => evaluate(expression));
const click = (selector) => evaluate(`(() => { const e = document.querySelector(${JSON.stringify(selector)});
  if (!e) throw new Error('no ' + ${JSON.stringify(selector)}); if (e.disabled) throw new Error(${JSON.stringify(selector)} + ' is disabled');
  e.click(); return true; })()`);
const type = (selector, value) => evaluate(`(() => { const e = document.querySelector(${JSON.stringify(selector)});
  e.focus(); e.value = ${JSON.stringify(value)}; e.dispatchEvent(new Event('input', { bubbles: true })); return true; })()`);
// A key pressed on the keyboard, as the user would (focus moves with Tab; Enter presses the focused button).
const keys = { Tab: { code: 'Tab', windowsVirtualKeyCode: 9 }, Enter: { code: 'Enter', windowsVirtualKeyCode: 13, text: '\r' } };
async function press(key) {
  await page('Input.dispatchKeyEvent', { type: 'keyDown', key, ...keys[key] });
  await page('Input.dispatchKeyEvent', { type: 'keyUp', key, code: keys[key].code, windowsVirtualKeyCode: keys[key].windowsVirtualKeyCode });
}
// Presses Tab until the focused element matches `selector` (at most `limit` presses); fails if it never does.
async function tabTo(selector, limit = 300) {
  for (let i = 0; i < limit; i++) {
    await press('Tab');
    if (await evaluate(`document.activeElement?.matches(${JSON.stringify(selector)}) ?? false`)) return i + 1;
  }
  fail(`${limit} presses of Tab never reached ${selector}`);
}
const submit = (selector) => evaluate(`document.querySelector(${JSON.stringify(selector)}).requestSubmit() ?? true`);
async function viewport(width, height, mobile = false) {
  await page('Emulation.setDeviceMetricsOverride', { width, height, deviceScaleFactor: 1, mobile });
}
// Waits for a laid-out page (right after a navigation or a viewport change Chromium may not have one yet, and
// refuses a screenshot "with 0 width"), then captures the whole page.
async function screenshot(name) {
  const size = await eventually(`the page is laid out for screenshot ${name}`, async () => {
    const metrics = await page('Page.getLayoutMetrics');
    const s = metrics.cssContentSize ?? metrics.contentSize;
    return s && s.width > 0 && s.height > 0 ? s : null;
  });
  const { data } = await page('Page.captureScreenshot', {
    format: 'png', captureBeyondViewport: true, clip: { x: 0, y: 0, width: size.width, height: size.height, scale: 1 },
  });
  fs.writeFileSync(path.join(shots, `${name}.png`), Buffer.from(data, 'base64'));
  step(`screenshot ${name}.png`);
}

// --- 1. The page and its headers ----------------------------------------------------------------------------------
const index = await request(adminPort, 'GET', '/');
const csp = index.headers['content-security-policy'] ?? '';
if (index.status !== 200 || !/script-src 'self'/.test(csp) || /unsafe-inline/.test(csp) || !/frame-ancestors 'none'/.test(csp) ||
    index.headers['x-content-type-options'] !== 'nosniff' || !/^text\/html/.test(index.headers['content-type'])) {
  fail(`GET / answered ${index.status} with headers ${JSON.stringify(index.headers)}`);
}
if (/<script>|\son\w+="/.test(index.body)) fail('the page has inline script, which its CSP forbids');
await viewport(1280, 900);
await page('Page.navigate', { url: `${base}/` });
await waitPage('the sign-in form shows', `!!document.querySelector('#token') && !document.querySelector('#sign-in').hidden`);
await screenshot('sign-in');

// --- 2. A wrong token is refused, with the reason -----------------------------------------------------------------
await type('#token', 'not-a-token-at-all');
await submit('#sign-in-form');
const refusal = await waitPage('a wrong token is refused on the page', `document.querySelector('#sign-in-error').textContent`);
if (!/wrong token/.test(refusal)) fail(`the refusal says '${refusal}', not why`);
if (!(await evaluate(`document.querySelector('#app').hidden`))) fail('the pool shows after a wrong token');
step(`wrong token refused: "${refusal}"`);

// --- 3. The admin signs in and sees the devices -------------------------------------------------------------------
await type('#token', admin);
await submit('#sign-in-form');
await waitPage('the admin view opens', `!document.querySelector('#app').hidden && document.querySelector('#viewer').textContent === 'admin'`);
await click('#tab-devices');
const listed = (await api('GET', '/v1/devices')).json.devices.map((d) => d.name).sort();
const shown = await waitPage('the page lists every device the API lists', `(() => {
  const names = [...document.querySelectorAll('#devices-table tr[data-device]')].map((r) => r.dataset.device).sort();
  return names.join(',') === ${JSON.stringify(listed.join(','))} ? names : null; })()`);
step(`devices on the page: ${shown.join(', ')}`);
await waitPage('both hosts show', `document.querySelectorAll('#hosts-table tr[data-host]').length === 2`);
await screenshot('devices');

// --- 4. Leases appear and end as guests (accelpool-run) acquire and release ---------------------------------------
// A holds one FPGA until its stdin gets a line; B asks for both, so it waits in the queue until A is done.
function guest(name, count) {
  const child = spawn(args.run, ['--pool', `tcp://${endpoints.guest_tcp}`, '--token', tenantT, '--guest', name, '--kind', 'fpga',
                                 '--count', String(count), '--', 'head', '-n', '1'],
                      { stdio: ['pipe', 'ignore', log(`${name}.log`)] });
  children.push(child);
  child.exited = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
  return child;
}
await click('#tab-leases');
const a = guest('vm-a', 1);
const leaseA = await waitPage('lease A appears live on the page', `(() => {
  const row = [...document.querySelectorAll('#live-table tr[data-lease]')].find((r) => r.textContent.includes('vm-a'));
  return row && row.textContent.includes('granted') ? Number(row.dataset.lease) : null; })()`);
if ((await api('GET', `/v1/leases/${leaseA}`)).json.state !== 'granted') fail(`lease ${leaseA} shows granted, the API disagrees`);
step(`lease ${leaseA} (vm-a) granted, on the page`);
const b = guest('vm-b', 2);
await click('#tab-queue');
const leaseB = await waitPage('lease B waits in the queue on the page', `(() => {
  const row = [...document.querySelectorAll('#queue-table tr[data-lease]')].find((r) => r.textContent.includes('vm-b'));
  return row ? Number(row.dataset.lease) : null; })()`);
if ((await api('GET', `/v1/leases/${leaseB}`)).json.state !== 'queued') fail(`lease ${leaseB} shows queued, the API disagrees`);
await screenshot('queue');
await click('#tab-leases');
await screenshot('leases');
a.stdin.end('done\n');
if ((await within('accelpool-run vm-a ends', a.exited)) !== 0) fail(`accelpool-run vm-a exited ${await a.exited}`);
await waitPage('lease A ends on the page (released) and B is granted', `(() => {
  const ended = document.querySelector('#recent-table tr[data-lease="${leaseA}"]');
  const live = document.querySelector('#live-table tr[data-lease="${leaseB}"]');
  return !!ended && ended.textContent.includes('released') && !document.querySelector('#live-table tr[data-lease="${leaseA}"]') &&
    !!live && live.textContent.includes('granted'); })()`);
step(`lease ${leaseA} ended released, lease ${leaseB} granted from the queue`);
b.stdin.end('done\n');
if ((await within('accelpool-run vm-b ends', b.exited)) !== 0) fail(`accelpool-run vm-b exited ${await b.exited}`);
await waitPage('lease B ends on the page', `!!document.querySelector('#recent-table tr[data-lease="${leaseB}"]') &&
  !document.querySelector('#live-table tr[data-lease="${leaseB}"]')`);
await submit('#history-form');
await waitPage('the paged history lists both ended leases', `!!document.querySelector('#history-table tr[data-lease="${leaseA}"]') &&
  !!document.querySelector('#history-table tr[data-lease="${leaseB}"]')`);

// --- 4b. A queue longer than a page, paged on the page -------------------------------------------------------------
// Through the real guest protocol: tenant u's guest holds the static host's one asic; two guests of u ask for it
// kFiller times ([leases] max_per_guest is 1,000); then a guest of t and one of u ask kQueued times each, in turns
// (t's and u's alternate at the queue's end). 2,260 requests wait: far more than a page (100 rows) and than the
// stream carries (200), and all of t's lie past the 2,000 the stream looks through for a tenant's entries, so t's
// pages (part 7) come from GET /v1/queue, its first one included.
const guestPort = Number(endpoints.guest_tcp.split(':').pop());
const asicHolder = await Guest.connect(guestPort, tenantU, 'asic-holder');
if ((await asicHolder.lease('acquire', { kind: 'asic' })).state !== 'granted') fail('the asic was not granted to its holder');
const fillers = [await Guest.connect(guestPort, tenantU, 'fill-1'), await Guest.connect(guestPort, tenantU, 'fill-2')];
const queuedLeases = await Promise.all(fillers.flatMap((g) => Array.from({ length: kFiller / 2 }, () => g.lease('acquire', { kind: 'asic' }))));
const queuers = [await Guest.connect(guestPort, tenantT, 'queue-t'), await Guest.connect(guestPort, tenantU, 'queue-u')];
for (let i = 0; i < 2 * kQueued; i++) queuedLeases.push(await queuers[i % 2].lease('acquire', { kind: 'asic' }));
if (queuedLeases.some((l) => l.state !== 'queued')) fail(`a request for the held asic was not queued: ${JSON.stringify(queuedLeases.find((l) => l.state !== 'queued'))}`);
for (const g of [asicHolder, ...fillers, ...queuers]) g.keepAlive((kTtlS / 4) * 1000);
const waiting = queuedLeases.length;

// The queue's rows on the page as [position, lease id], and GET /v1/queue's answer to `token` for `cursor` alike.
const shownQueue = () => evaluate(`[...document.querySelectorAll('#queue-table tr[data-lease]')].map((r) => [Number(r.dataset.position), Number(r.dataset.lease)])`);
async function apiQueue(token, cursor) {
  const r = await request(adminPort, 'GET', `/v1/queue?limit=${kPageRows}&cursor=${cursor}`, { token });
  if (r.status !== 200) fail(`GET /v1/queue?cursor=${cursor} answered ${r.status}: ${r.body}`);
  return r.json.queue.map((e) => [e.position, e.id]);
}
// Waits until the page shows exactly what GET /v1/queue answers `token` for `cursor` (the page reads its page again
// every few seconds, and the policy's order may move between two reads); returns those rows.
const pageShowsQueue = (what, token, cursor) => eventually(what, async () => {
  const shown = await shownQueue();
  return shown.length > 0 && JSON.stringify(shown) === JSON.stringify(await apiQueue(token, cursor)) ? shown : null;
});
const positionsFrom = (rows, first) => rows.every(([position], i) => position === first + i);
await click('#tab-queue');
const firstPage = await pageShowsQueue('the queue\'s first page shows GET /v1/queue\'s first entries', admin, 0);
if (firstPage.length !== kPageRows || !positionsFrom(firstPage, 1)) fail(`the first page shows ${JSON.stringify(firstPage)}`);
// The next page with the keyboard only.
await evaluate(`document.activeElement?.blur() ?? true`);
await tabTo('#queue-next');
await press('Enter');
const secondPage = await pageShowsQueue('the second page shows GET /v1/queue\'s answer for cursor 100', admin, kPageRows);
if (secondPage.length !== kPageRows || !positionsFrom(secondPage, kPageRows + 1)) fail(`the second page shows ${JSON.stringify(secondPage)}`);
step(`queue of ${waiting}: the second page (Tab, Enter) shows positions ${secondPage[0][0]}-${secondPage.at(-1)[0]}, as GET /v1/queue?cursor=${kPageRows}`);
// A position far past the stream's 200, typed into the jump field and entered: the queue's last 30.
const jumpTo = waiting - 29;
await tabTo('#queue-at');
await page('Input.insertText', { text: String(jumpTo) });
await press('Enter');
const lastPage = await pageShowsQueue(`the page from position ${jumpTo} shows GET /v1/queue's answer`, admin, jumpTo - 1);
if (lastPage.length !== 30 || !positionsFrom(lastPage, jumpTo)) fail(`the page from position ${jumpTo} shows ${JSON.stringify(lastPage)}`);
if (!(await evaluate(`document.querySelector('#queue-next').disabled`))) fail('the last page of the queue offers a next page');
step(`jumped to position ${jumpTo}: the last ${lastPage.length} entries, as GET /v1/queue?cursor=${jumpTo - 1}`);
await screenshot('queue-pages');
await click('#queue-first');
await pageShowsQueue('the first page again', admin, 0);

// --- 5. Drain a device from the page; the API agrees --------------------------------------------------------------
const target = agentDevices[0];
await click('#tab-devices');
await waitPage(`${target}'s drain button is ready`, `!!document.querySelector('#devices-table tr[data-device="${target}"] button[data-action="drain"]:not([disabled])')`);
await click(`#devices-table tr[data-device="${target}"] button[data-action="drain"]`);
await waitPage(`${target} shows draining on the page`, `document.querySelector('#devices-table tr[data-device="${target}"]').textContent.includes('draining')`);
const drained = (await api('GET', `/v1/devices/${target}`)).json;
if (drained.draining !== true) fail(`the page drained ${target}, the API says ${JSON.stringify(drained)}`);
step(`${target} drained from the page; the API agrees`);
await click(`#devices-table tr[data-device="${target}"] button[data-action="undrain"]`);
await waitPage(`${target} shows free again`, `document.querySelector('#devices-table tr[data-device="${target}"]').textContent.includes('free')`);
if ((await api('GET', `/v1/devices/${target}`)).json.draining !== false) fail(`the page undrained ${target}, the API disagrees`);

// --- 5b. The same with the keyboard only: Tab reaches the drain button, Enter presses it -----------------------------
const second = agentDevices[1];
const drainSelector = `#devices-table tr[data-device="${second}"] button[data-action="drain"]`;
await evaluate(`document.activeElement?.blur() ?? true`);
const presses = await tabTo(drainSelector);
await press('Enter');
await waitPage(`${second} shows draining after Enter`, `document.querySelector('#devices-table tr[data-device="${second}"]').textContent.includes('draining')`);
if ((await api('GET', `/v1/devices/${second}`)).json.draining !== true) fail(`Enter on the drain button of ${second}: the API disagrees`);
step(`${second} drained with the keyboard only (${presses} presses of Tab, then Enter); the API agrees`);
await tabTo(`#devices-table tr[data-device="${second}"] button[data-action="undrain"]`);
await press('Enter');
await waitPage(`${second} shows free again`, `document.querySelector('#devices-table tr[data-device="${second}"]').textContent.includes('free')`);
if ((await api('GET', `/v1/devices/${second}`)).json.draining !== false) fail(`the keyboard undrained ${second}, the API disagrees`);

// --- 5c. Revoke a lease from the page; the API agrees ---------------------------------------------------------------
await click('#tab-leases');
const c = guest('vm-c', 1);
const leaseC = await waitPage('lease C appears live on the page', `(() => {
  const row = [...document.querySelectorAll('#live-table tr[data-lease]')].find((r) => r.textContent.includes('vm-c'));
  return row && row.textContent.includes('granted') ? Number(row.dataset.lease) : null; })()`);
await waitPage(`lease ${leaseC}'s revoke button is ready`, `!!document.querySelector('#live-table tr[data-lease="${leaseC}"] button[data-action="revoke"]:not([disabled])')`);
await click(`#live-table tr[data-lease="${leaseC}"] button[data-action="revoke"]`);
// The guest is told; accelpool-run stops its command and releases within the grace period (else the manager
// ends the lease revoked at its deadline).
const endedC = await waitPage(`lease ${leaseC} leaves the live table and ends`, `(() => {
  const ended = document.querySelector('#recent-table tr[data-lease="${leaseC}"]');
  return ended && !document.querySelector('#live-table tr[data-lease="${leaseC}"]') ? ended.querySelector('.state').textContent : null; })()`);
const apiC = (await api('GET', `/v1/leases/${leaseC}`)).json;
if (!['released', 'revoked'].includes(endedC) || apiC.state !== endedC) fail(`lease ${leaseC} revoked from the page shows ${endedC}; the API says ${JSON.stringify(apiC)}`);
await within('accelpool-run vm-c ends', c.exited);
if (!/being revoked/.test(fs.readFileSync(path.join(args.work, 'vm-c.log'), 'utf8'))) fail(`the guest of lease ${leaseC} was not told of the revocation`);
step(`lease ${leaseC} (vm-c) revoked from the page: the guest was told and the lease ended ${endedC}; the API agrees`);

// --- 5d. Upload a bitstream from the page, then delete it ------------------------------------------------------------
const image = crypto.randomBytes(4096);
const imageFile = path.join(args.work, 'dash-upload-1.0.0.bin');
fs.writeFileSync(imageFile, image);
const sha = crypto.createHash('sha256').update(image).digest('hex');
await click('#tab-bitstreams');
await type('#upload-manifest', `name = "dash-upload"\nversion = "1.0.0"\nkind = "fpga"\nfile = "dash-upload-1.0.0.bin"\n` +
  `format = "opaque"\nsha256 = "${sha}"\nprogramming_seconds = 0\ncompatible = ["*"]\n`);
const { root } = await page('DOM.getDocument', {});
const { nodeId } = await page('DOM.querySelector', { nodeId: root.nodeId, selector: '#upload-file' });
await page('DOM.setFileInputFiles', { nodeId, files: [imageFile] });
await submit('#upload-form');
await waitPage('the uploaded bitstream is listed on the page', `!!document.querySelector('#bitstreams-table tr[data-bitstream="dash-upload"]')`);
const uploaded = (await api('GET', '/v1/bitstreams/dash-upload/1.0.0')).json;
if (uploaded?.sha256 !== sha) fail(`uploaded from the page; the API shows ${JSON.stringify(uploaded)}`);
step(`bitstream dash-upload 1.0.0 uploaded from the page (sha256 ${sha.slice(0, 12)}...); the API agrees`);
await click('#bitstreams-table tr[data-bitstream="dash-upload"] button[data-action="delete"]');
await waitPage('the deleted bitstream leaves the page', `!document.querySelector('#bitstreams-table tr[data-bitstream="dash-upload"]')`);
if ((await api('GET', '/v1/bitstreams/dash-upload/1.0.0')).status !== 404) fail('deleted from the page, the API still lists it');
step('bitstream dash-upload deleted from the page; the API agrees');

// --- 6. Switch the policy from the page; a bad one is refused with the API's reason --------------------------------
await click('#tab-overview');
await type('#policy', 'nonsense');
await submit('#policy-form');
const bad = await waitPage('a bad policy is refused on the page', `(() => { const s = document.querySelector('#status');
  return s.classList.contains('bad') && s.textContent.includes('/v1/policy') ? s.textContent : null; })()`);
if ((await api('GET', '/v1/policy')).json.policy !== 'fifo+first-fit') fail('a refused policy changed the pool\'s');
step(`bad policy refused: "${bad}"`);
await type('#policy', 'sjf+first-fit');
await submit('#policy-form');
await waitPage('the page shows the new policy', `document.querySelector('#policy-now').textContent === 'policy sjf+first-fit'`);
if ((await api('GET', '/v1/policy')).json.policy !== 'sjf+first-fit') fail('the page switched the policy, the API disagrees');
step('policy switched to sjf+first-fit from the page; the API agrees');
await waitPage('the charts have points', `document.querySelectorAll('#chart-busy polyline').length === 1`);
// The wait and JCT charts of one tenant: the groups seen in the statistics are offered in the list.
await waitPage('tenant t is offered in the chart list', `[...document.querySelector('#chart-group').options].some((o) => o.value === 'tenant t')`);
await evaluate(`(() => { const s = document.querySelector('#chart-group'); s.value = 'tenant t';
  s.dispatchEvent(new Event('change')); return true; })()`);
await waitPage('the wait and JCT charts show tenant t', `[...document.querySelectorAll('.chart-group-name')].every((e) => e.textContent === 'tenant t') &&
  document.querySelectorAll('#chart-wait polyline').length === 3 && document.querySelectorAll('#chart-jct polyline').length === 3`);
step('wait and JCT charts switched to tenant t');
await screenshot('overview');
await viewport(390, 844, true);
await screenshot('overview-phone');
await viewport(1280, 900);

// --- 7. A tenant's view: its own leases only, no actions -----------------------------------------------------------
const other = spawn(args.run, ['--pool', `tcp://${endpoints.guest_tcp}`, '--token', tenantU, '--guest', 'vm-u', '--kind', 'fpga',
                               '--', 'head', '-n', '1'], { stdio: ['pipe', 'ignore', log('vm-u.log')] });
children.push(other);
const otherExited = new Promise((resolve) => other.on('exit', resolve));
const leaseU = await eventually('tenant u\'s lease is granted', async () => {
  const r = await api('GET', '/v1/leases?tenant=u&guest=vm-u&state=granted');
  return r.json?.leases?.[0]?.id;
});
await click('#sign-out');
await waitPage('signed out', `!document.querySelector('#sign-in').hidden`);
await type('#token', tenantT);
await submit('#sign-in-form');
await waitPage('tenant t\'s view opens', `document.querySelector('#viewer').textContent === 'tenant t' && document.body.classList.contains('tenant')`);
await click('#tab-leases');
await click('#tab-devices');
const tenantView = await waitPage('the tenant sees the devices, no actions, not tenant u\'s lease', `(() => {
  const rows = [...document.querySelectorAll('#devices-table tr[data-device]')];
  if (rows.length !== ${listed.length}) return null;
  const leaseIds = rows.map((r) => r.querySelector('[data-lease-cell]').textContent).filter((t) => t);
  return { leaseIds, actions: document.querySelectorAll('button[data-action]').length,
           bitstreams: getComputedStyle(document.querySelector('#tab-bitstreams')).display }; })()`);
if (tenantView.leaseIds.length !== 0 || tenantView.actions !== 0 || tenantView.bitstreams !== 'none') {
  fail(`tenant t sees another tenant's lease (${leaseU}) or admin actions: ${JSON.stringify(tenantView)}`);
}
step('tenant t sees the devices without tenant u\'s lease and without actions');
await screenshot('tenant');
// Its queue: its own requests only, paged, each at its position in the whole queue; the first page too is read from
// GET /v1/queue (the stream has none of t's entries).
await click('#tab-queue');
const ownFirst = await pageShowsQueue('tenant t\'s first page of the queue shows its own first entries', tenantT, 0);
const ownRange = await evaluate(`document.querySelector('#queue-range').textContent`);
if (!ownRange.includes('as read at')) fail(`tenant t's first page, none of it in the stream, says '${ownRange}'`);
await click('#queue-next');
const ownSecond = await pageShowsQueue('tenant t\'s second page shows GET /v1/queue\'s answer to its token', tenantT, kPageRows);
const tenants = await evaluate(`[...document.querySelectorAll('#queue-table tr[data-lease] td:nth-child(3)')].map((c) => c.textContent)`);
const ownIds = new Set(queuedLeases.filter((l) => l.tenant === 't').map((l) => l.id));
if (ownFirst.length !== kPageRows || ownSecond.length !== kQueued - kPageRows || tenants.some((t) => t !== 't') ||
    ![...ownFirst, ...ownSecond].every(([, id]) => ownIds.has(id))) {
  fail(`tenant t's queue pages show ${JSON.stringify({ ownFirst, ownSecond, tenants })}`);
}
step(`tenant t pages its own ${kQueued} queued requests: the second page shows positions ${ownSecond[0][0]}-${ownSecond.at(-1)[0]} of the whole queue`);
other.stdin.end('done\n');
await within('accelpool-run vm-u ends once its job has its line', otherExited);

if (pageErrors.length) fail(`the page logged errors:\n${pageErrors.join('\n')}`);
stopping = true;
await within('chromium closes', closeBrowser(cdp, browser));
manager.kill('SIGTERM');
agent.kill('SIGTERM');
console.log('dashboard: PASS');
process.exit(0);
