// The admin API's contract, checked by outside tools against the real accelpool-manager on loopback
// (docs/testing.md, "The API contract"):
//   1. Redocly CLI lints docs/api/openapi.yaml (OpenAPI 3.0 structure, references, operationIds, tags, and the
//      rules of docs/api/redocly.yaml);
//   2. every operation is called through Prism's validating proxy (`prism proxy`), with each kind of credential
//      and each answer the operation documents. Prism checks every request and answer against the document and
//      reports each disagreement in its `sl-violations` header.
// A mismatch is: a status other than the call expects, an answer Prism finds in violation of the document, a
// request Prism finds invalid where the call meant a valid one, an operation never called, or a documented status
// never seen (but 500 and 503, which need a broken store or an empty pool). Exits 0 only with zero mismatches.
//
// Usage: node contract_test.mjs --manager BIN --tools DIR --spec FILE --work DIR
//   --tools: the folder scripts/setup.sh installs the contract tools into (node_modules/.bin/{prism,redocly}).
import { spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';

import { Guest } from '../support/guest_client.mjs';
import { loopbackConfig, request, startManager, waiter } from '../support/manager_process.mjs';

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, a, i, all) => (a.startsWith('--') ? [...pairs, [a.slice(2), all[i + 1]]] : pairs), []));
for (const key of ['manager', 'tools', 'spec', 'work']) {
  if (!args[key]) {
    console.error(`contract: missing --${key}`);
    process.exit(2);
  }
}
const bin = (name) => path.join(args.tools, 'node_modules', '.bin', name);
// A hung step fails the test instead of hanging it; nothing waits for it to pass.
const kHungAfterMs = 120000;
const kAgentToken = 'contract-agent-token-0123456789';
const kMetricsToken = 'contract-metrics-token-0123456789';
const kMaxBody = 65536;
const children = [];
let stopping = false;  // set once the manager and Prism are told to stop
process.on('exit', () => children.forEach((c) => c.kill('SIGKILL')));

function fail(message) {
  console.error(`contract: ${message}`);
  process.exit(1);
}

for (const tool of ['prism', 'redocly']) {
  if (!fs.existsSync(bin(tool))) {
    fail(`${bin(tool)} is missing: run scripts/setup.sh (it installs the contract tools into ${args.tools})`);
  }
}

// --- 1. The document validates ----------------------------------------------------------------------------------
const lint = spawnSync(bin('redocly'), ['lint', args.spec, '--config', path.join(path.dirname(args.spec), 'redocly.yaml'),
                                       '--format', 'stylish'],
                       { encoding: 'utf8', env: { ...process.env, REDOCLY_TELEMETRY: 'off', REDOCLY_SUPPRESS_UPDATE_NOTICE: 'true' },
                         timeout: kHungAfterMs });
process.stdout.write(lint.stdout.split('\n').filter((l) => !/[║╔╚]/.test(l)).join('\n'));
process.stdout.write(lint.stderr.split('\n').filter((l) => !/[║╔╚]/.test(l)).join('\n'));
if (lint.status !== 0) fail(`redocly lint found problems in ${args.spec} (exit ${lint.status})`);

// --- helpers ----------------------------------------------------------------------------------------------------
const eventually = waiter(kHungAfterMs, fail);

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// --- 2. The running manager, behind Prism -------------------------------------------------------------------------
fs.rmSync(args.work, { recursive: true, force: true });
fs.mkdirSync(args.work, { recursive: true });
const started = await startManager({
  bin: args.manager, work: args.work, dataDir: args.work, eventually, fail,
  config: loopbackConfig({ agentToken: kAgentToken, kind: 'fpga', count: 2, slots: 2, tenants: ['alpha'],
                           leases: `ttl_s = 600\n[limits]\nmax_body_bytes = ${kMaxBody}\n[metrics]\ntoken = "${kMetricsToken}"\n` }),
  onExit: (code, log) => { if (!stopping) fail(`accelpool-manager exited (${code}):\n${log}`); },
});
const manager = started.process;
children.push(manager);
const { endpoints, tokenOf } = started;
const admin = tokenOf('admin token');
const tenant = tokenOf('guest token for tenant alpha');
const adminPort = Number(endpoints.admin.split(':').pop());
const guestPort = Number(endpoints.guest_tcp.split(':').pop());

const prismPort = await freePort();
const prismLog = path.join(args.work, 'prism.log');
const prism = spawn(bin('prism'), ['proxy', args.spec, `http://127.0.0.1:${adminPort}`, '--host', '127.0.0.1',
                                   '--port', String(prismPort), '--errors', 'false'],
                    { stdio: ['ignore', fs.openSync(prismLog, 'w'), fs.openSync(prismLog, 'a')] });
children.push(prism);
prism.on('exit', (code) => { if (!stopping) fail(`prism exited (${code}):\n${fs.readFileSync(prismLog, 'utf8')}`); });
await eventually('prism listens', () => request(prismPort, 'GET', '/healthz').then((r) => r.status === 200, () => false));

// --- the calls ----------------------------------------------------------------------------------------------------
const spec = JSON.parse(spawnSync(bin('redocly'), ['bundle', args.spec, '--ext', 'json', '--dereferenced'],
                                  { encoding: 'utf8', maxBuffer: 1 << 26, env: { ...process.env, REDOCLY_TELEMETRY: 'off' } }).stdout);
const operations = [];  // {key: "get /v1/hosts", template, method, codes, body: has a request body, public}
for (const [template, item] of Object.entries(spec.paths)) {
  for (const method of ['get', 'put', 'post', 'delete', 'patch']) {
    const op = item[method];
    if (!op) continue;
    operations.push({ key: `${method} ${template}`, template, method, codes: Object.keys(op.responses).map(Number),
                      body: !!op.requestBody, public: Array.isArray(op.security) && op.security.length === 0 });
  }
}
const templates = operations.map((o) => ({ ...o, re: new RegExp(`^${o.template.replace(/\{[^}]+\}/g, '[^/]+').replace(/\./g, '\\.')}$`) }));
// The operation a concrete call is: the template with the fewest parameters that matches (as Prism picks).
function operationOf(method, target) {
  const p = target.split('?')[0];
  const found = templates.filter((o) => o.method === method.toLowerCase() && o.re.test(p));
  found.sort((a, b) => (a.template.match(/\{/g) || []).length - (b.template.match(/\{/g) || []).length);
  return found[0];
}

const mismatches = [];
const seen = new Map();  // operation key -> Set of statuses
let calls = 0;
// Calls `method target` through Prism and checks it answers `expected`, within the document. `given`: token, body,
// contentType, label (for the report).
async function check(expected, method, target, given = {}) {
  const options = { token: admin, ...given };  // the admin's token unless the call names another ('' for none)
  const op = operationOf(method, target);
  const what = `${method} ${target}${options.label ? ` (${options.label})` : ''}`;
  if (!op) {
    mismatches.push(`${what}: no operation of the document matches`);
    return null;
  }
  // Prism does not forward a GET with a body: such a call goes to the manager directly (its status is checked; the
  // error answer's schema is the one Prism checks on every other 400).
  const direct = method === 'GET' && options.body !== undefined;
  const r = await request(direct ? adminPort : prismPort, method, target, options);
  ++calls;
  if (!seen.has(op.key)) seen.set(op.key, new Set());
  seen.get(op.key).add(r.status);
  if (r.status !== expected) mismatches.push(`${what}: answered ${r.status}, expected ${expected}: ${r.body.slice(0, 300)}`);
  let violations = [];
  if (r.headers['sl-violations']) {
    try {
      violations = JSON.parse(r.headers['sl-violations']);
    } catch {
      violations = [{ location: ['response'], message: r.headers['sl-violations'] }];
    }
  }
  for (const v of violations) {
    const where = (v.location || []).join('.');
    const intended = expected >= 400 && where.startsWith('request');  // the call is wrong on purpose
    if (!intended) mismatches.push(`${what} -> ${r.status}: ${where}: ${v.message}`);
  }
  return r;
}
const json = (r) => JSON.parse(r.body);

// Probes.
await check(200, 'GET', '/healthz');
await check(200, 'GET', '/readyz');
await check(200, 'GET', '/metrics');  // an admin token opens it too
await check(200, 'GET', '/metrics', { token: kMetricsToken, label: 'metrics token' });
await check(401, 'GET', '/metrics', { token: '', label: 'no token while [metrics] token is set' });
await check(200, 'GET', '/v1/openapi.yaml');

// The dashboard's files (no token), and revalidation by ETag.
const page = await check(200, 'GET', '/', { token: '' });
await check(304, 'GET', '/', { token: '', headers: { 'if-none-match': page.headers.etag }, label: 'unchanged' });
if (!/script-src 'self'/.test(page.headers['content-security-policy'] ?? '') || page.headers['x-content-type-options'] !== 'nosniff') {
  mismatches.push(`GET /: no Content-Security-Policy or nosniff header: ${JSON.stringify(page.headers)}`);
}
const script = await check(200, 'GET', '/assets/app.js', { token: '' });
await check(304, 'GET', '/assets/app.js', { token: '', headers: { 'if-none-match': script.headers.etag }, label: 'unchanged' });
await check(200, 'GET', '/assets/app.css', { token: '' });
await check(404, 'GET', '/assets/nothing.js', { token: '' });

// A tenant's guest holds a lease; which device it got is read back.
const guest = await Guest.connect(guestPort, tenant, 'vm-1');
const held = await guest.lease('acquire', { kind: 'fpga' });
const heldDevice = held.devices[0];
const freeDevice = heldDevice === 'local/fpga0' ? 'local/fpga1' : 'local/fpga0';

// Hosts.
await check(200, 'GET', '/v1/hosts');
await check(200, 'GET', '/v1/hosts?connected=true&limit=1');
await check(400, 'GET', '/v1/hosts?limit=0');
await check(400, 'GET', '/v1/hosts?connected=maybe');
await check(200, 'GET', '/v1/hosts/local');
await check(404, 'GET', '/v1/hosts/nohost');
await check(200, 'POST', '/v1/hosts/local/drain', { body: { deadline_s: 600 } });
await check(200, 'POST', '/v1/hosts/local/drain', { label: 'bodiless: clears the deadline' });
await check(400, 'POST', '/v1/hosts/local/drain', { body: { deadline_s: -1 } });
await check(400, 'POST', '/v1/hosts/local/drain', { body: { deadline_s: 31536001 } });
await check(404, 'POST', '/v1/hosts/nohost/drain');
await check(400, 'POST', '/v1/hosts/local/undrain', { body: { deadline_s: 5 } });
await check(200, 'POST', '/v1/hosts/local/undrain');
await check(404, 'POST', '/v1/hosts/nohost/undrain');

// Devices.
await check(200, 'GET', '/v1/devices');
await check(200, 'GET', '/v1/devices?host=local&state=leased&limit=1');
await check(400, 'GET', '/v1/devices?state=bogus');
await check(200, 'GET', `/v1/devices/${heldDevice}`);
await check(200, 'GET', `/v1/devices/${freeDevice}:slot1`, { label: 'a slot' });
await check(200, 'GET', '/v1/devices?state=shared');
await check(404, 'GET', '/v1/devices/local/nope');
await check(200, 'POST', `/v1/devices/${freeDevice}/drain`, { body: { deadline_s: 60 } });
await check(400, 'POST', `/v1/devices/${freeDevice}/drain`, { body: { deadline_s: 'soon' } });
await check(404, 'POST', '/v1/devices/local/nope/drain');
await check(400, 'POST', `/v1/devices/${freeDevice}/undrain`, { body: { deadline_s: 1 } });
await check(200, 'POST', `/v1/devices/${freeDevice}/undrain`, { body: {} });
await check(404, 'POST', '/v1/devices/local/nope/undrain');
await check(202, 'POST', `/v1/devices/${freeDevice}/reset`);
await check(409, 'POST', `/v1/devices/${heldDevice}/reset`);
await check(400, 'POST', `/v1/devices/${freeDevice}/reset`, { body: { force: true } });
await check(404, 'POST', '/v1/devices/local/nope/reset');

// Leases and the queue.
await check(200, 'GET', '/v1/leases');
await check(200, 'GET', '/v1/leases?all=true&limit=1&order=desc&tenant=alpha');
await check(400, 'GET', '/v1/leases?order=up');
await check(400, 'GET', '/v1/leases?state=sleeping');
await check(200, 'GET', `/v1/leases/${held.id}`);
await check(400, 'GET', '/v1/leases/abc');
await check(404, 'GET', '/v1/leases/999999');
// A request for both devices waits while one is held, so the queue's pages have an entry to check.
const waiting = await guest.lease('acquire', { kind: 'fpga', count: 2 });
if (waiting.state !== 'queued') mismatches.push(`a request for both devices while one is held: ${waiting.state}, not queued`);
await check(200, 'GET', '/v1/queue');
await check(200, 'GET', '/v1/queue?limit=1&cursor=0');
await check(400, 'GET', '/v1/queue?cursor=first');
const own = await check(200, 'GET', '/v1/queue?limit=1', { token: tenant, label: 'a tenant token: its own entries' });
if (json(own).queue[0]?.id !== waiting.id) mismatches.push(`GET /v1/queue with the tenant's token: ${own.body.slice(0, 300)}`);
await guest.lease('cancel', { lease: waiting.id });

// Bitstreams: a small opaque one uploaded, used by a lease, deleted.
const image = Buffer.from('accelpool contract test image\n');
const sha = createHash('sha256').update(image).digest('hex');
const manifest = (sum, version = '1.0.0') =>
  `name = "contract"\nversion = "${version}"\nkind = "fpga"\nfile = "contract-${version}.bin"\nformat = "opaque"\n` +
  `sha256 = "${sum}"\nprogramming_seconds = 0\ncompatible = ["*"]\n`;
await check(200, 'GET', '/v1/bitstreams');
await check(201, 'POST', '/v1/bitstreams', { body: { manifest: manifest(sha), content_base64: image.toString('base64') } });
await check(409, 'POST', '/v1/bitstreams', { body: { manifest: manifest(sha), content_base64: image.toString('base64') } });
await check(422, 'POST', '/v1/bitstreams', { body: { manifest: manifest('0'.repeat(64), '1.0.1'),
                                                      content_base64: image.toString('base64') },
                                              label: 'its sha256 is not the image\'s' });
await check(400, 'POST', '/v1/bitstreams', { body: { manifest: manifest(sha) } });
await check(200, 'GET', '/v1/bitstreams/contract');
await check(404, 'GET', '/v1/bitstreams/nope');
await check(200, 'GET', '/v1/bitstreams/contract/1.0.0');
await check(404, 'GET', '/v1/bitstreams/contract/9.9.9');
const user = await guest.lease('acquire', { kind: 'fpga', bitstream: 'contract' });
await check(409, 'DELETE', '/v1/bitstreams/contract/1.0.0');
await guest.lease('release', { lease: user.id });

// Images by sha256: the admin's and the agents' token.
await check(200, 'GET', `/v1/images/${sha}`);
await check(200, 'GET', `/v1/images/${sha}`, { token: kAgentToken });
await check(200, 'GET', `/v1/images/${sha}/manifest`, { token: kAgentToken });
await check(404, 'GET', `/v1/images/${'0'.repeat(64)}`);
await check(404, 'GET', `/v1/images/${'0'.repeat(64)}/manifest`);
await check(200, 'DELETE', '/v1/bitstreams/contract/1.0.0');
await check(404, 'DELETE', '/v1/bitstreams/contract/1.0.0');

// Tenants.
await check(200, 'GET', '/v1/tenants');
await check(201, 'POST', '/v1/tenants', { body: { name: 'beta', weight: 2 } });
await check(409, 'POST', '/v1/tenants', { body: { name: 'beta' } });
await check(400, 'POST', '/v1/tenants', { body: { name: 'no spaces' } });
await check(400, 'POST', '/v1/tenants', { body: { name: 'gamma', weight: 0 } });
await check(200, 'GET', '/v1/tenants/beta');
await check(404, 'GET', '/v1/tenants/nope');
await check(200, 'PATCH', '/v1/tenants/beta', { body: { max_devices: 3 } });
await check(400, 'PATCH', '/v1/tenants/beta', { body: { weight: -1 } });
await check(404, 'PATCH', '/v1/tenants/nope', { body: { max_devices: 1 } });
await check(200, 'POST', '/v1/tenants/beta/rotate-token');
await check(400, 'POST', '/v1/tenants/beta/rotate-token', { body: { now: true } });
await check(404, 'POST', '/v1/tenants/nope/rotate-token');
await check(409, 'DELETE', '/v1/tenants/alpha', { label: 'it has a live lease' });
await check(200, 'DELETE', '/v1/tenants/beta');
await check(404, 'DELETE', '/v1/tenants/beta');

// Admin tokens.
await check(200, 'GET', '/v1/admin-tokens');
await check(201, 'POST', '/v1/admin-tokens', { body: { name: 'ops' } });
await check(409, 'POST', '/v1/admin-tokens', { body: { name: 'ops' } });
await check(400, 'POST', '/v1/admin-tokens', { body: { name: 'no spaces' } });
await check(200, 'POST', '/v1/admin-tokens/ops/rotate');
await check(404, 'POST', '/v1/admin-tokens/nobody/rotate');
await check(200, 'DELETE', '/v1/admin-tokens/ops');
await check(404, 'DELETE', '/v1/admin-tokens/ops');
await check(409, 'DELETE', '/v1/admin-tokens/admin', { label: 'the only one left' });

// Policy and stats.
await check(200, 'GET', '/v1/policy');
await check(200, 'PUT', '/v1/policy', { body: { policy: 'fifo+first-fit' } });
await check(400, 'PUT', '/v1/policy', { body: { policy: 'nonsense' } });
await check(200, 'GET', '/v1/leadership');
await check(400, 'GET', '/v1/leadership?x=1');
await check(200, 'GET', '/v1/stats');
await check(200, 'GET', '/v1/estimates');
await check(400, 'GET', '/v1/estimates?window=60');
await check(200, 'GET', '/v1/stats?window=60');
await check(400, 'GET', '/v1/stats?window=0');

// Revocation last among the leases: the lease ends revoked only after its grace.
await check(400, 'POST', `/v1/leases/${held.id}/revoke`, { body: { reason: 5 } });
await check(404, 'POST', '/v1/leases/999999/revoke');
await check(200, 'POST', `/v1/leases/${held.id}/revoke`, { body: { reason: 'contract test' } });
await guest.lease('release', { lease: held.id });
await check(409, 'POST', `/v1/leases/${held.id}/revoke`, { label: 'it has ended' });

// The event stream never ends, so Prism (which reads a whole answer) cannot stand in the middle: its first event
// is read from the manager directly and checked against what the document says of it (status, content type, the
// snapshot's members, each token's view). Its refusals (401, 400) go through Prism below.
async function firstEvent(token) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: adminPort, path: '/v1/events', agent: false,
                               headers: { authorization: `Bearer ${token}` } }, (res) => {
      let text = '';
      res.on('data', (c) => {
        text += c.toString('utf8');
        const end = text.indexOf('\n\n');
        if (end < 0) return;
        req.destroy();
        resolve({ status: res.statusCode, type: res.headers['content-type'], event: text.slice(0, end) });
      });
    });
    req.setTimeout(kHungAfterMs, () => req.destroy(new Error('GET /v1/events: no first event')));
    req.on('error', (e) => (e.code === 'ECONNRESET' ? null : reject(e)));
    req.end();
  });
}
for (const [who, token, role] of [['admin', admin, 'admin'], ['tenant', tenant, 'tenant']]) {
  const first = await firstEvent(token);
  ++calls;
  if (!seen.has('get /v1/events')) seen.set('get /v1/events', new Set());
  seen.get('get /v1/events').add(first.status);
  const [eventLine, dataLine] = first.event.split('\n');
  let snapshot = null;
  try { snapshot = JSON.parse(dataLine.replace(/^data: /, '')); } catch { /* reported below */ }
  const members = ['seq', 'viewer', 'summary', 'devices', 'hosts', 'leases', 'queue'];
  if (first.status !== 200 || first.type !== 'text/event-stream' || eventLine !== 'event: snapshot' || !snapshot ||
      !members.every((m) => m in snapshot) || snapshot.viewer.role !== role ||
      snapshot.devices.length !== 2) {
    mismatches.push(`GET /v1/events (direct, ${who} token): ${first.status} ${first.type}: ${first.event.slice(0, 300)}`);
  }
}
await check(400, 'GET', '/v1/events', { body: 'this is not JSON', contentType: 'text/plain', label: 'a body' });

// Every operation with each wrong credential, a body that is not JSON, and a body over the limit.
const concrete = (template) => template.replace('{host}/{local_id}', freeDevice).replace('{host}', 'local')
  .replace('{id}', String(held.id)).replace('{bitstream}', 'vadd').replace('{version}', '1.0.0')
  .replace('{sha256}', sha).replace('{name}', 'alpha');
for (const op of operations.filter((o) => !o.public)) {
  const target = concrete(op.template);
  const method = op.method.toUpperCase();
  await check(401, method, target, { token: '', label: 'no token' });
  await check(401, method, target, { token: 'not-a-token', label: 'an unknown token' });
  if (op.template === '/v1/events' || op.template === '/v1/queue') continue;  // a tenant's token is welcome; the other refusals: above
  await check(403, method, target, { token: tenant, label: 'a tenant token' });
  if (!op.template.startsWith('/v1/images/')) {
    await check(400, method, target, { token: admin, body: 'this is not JSON', contentType: 'text/plain', label: 'a body that is not JSON' });
  }
  if (op.body) {
    await check(413, method, target, { token: admin, body: { padding: 'x'.repeat(kMaxBody) }, label: 'a body over the limit' });
  }
}

// Outside the document (Prism answers these itself): the manager's own answers for a method a path does not
// list and for a path that does not exist.
for (const [expected, method, target] of [[405, 'PUT', '/healthz'], [405, 'DELETE', '/v1/bitstreams/vadd'],
                                          [405, 'GET', '/v1/hosts/local/drain'], [404, 'GET', '/v1/nothing']]) {
  const r = await request(adminPort, method, target, { token: admin });
  ++calls;
  if (r.status !== expected || !json(r).error?.message) mismatches.push(`${method} ${target} (direct): answered ${r.status} ${r.body}, expected ${expected}`);
}

// Coverage: every operation called, every documented status seen.
const kUnprovoked = new Set([500, 503]);
for (const op of operations) {
  const statuses = seen.get(op.key);
  if (!statuses) {
    mismatches.push(`${op.key}: never called`);
    continue;
  }
  for (const code of op.codes) {
    if (!statuses.has(code) && !kUnprovoked.has(code)) mismatches.push(`${op.key}: documented ${code} never seen`);
  }
}

stopping = true;
guest.close();
prism.kill('SIGTERM');
manager.kill('SIGTERM');
for (const m of mismatches) console.log(`MISMATCH ${m}`);
console.log(`contract: ${operations.length} operations, ${calls} calls, ${mismatches.length} mismatches`);
process.exit(mismatches.length === 0 ? 0 : 1);
