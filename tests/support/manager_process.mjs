// The real accelpool-manager for the Node.js tests (tests/contract, tests/browser): a loopback configuration, the
// process started in a scratch folder, and its endpoints and once-printed tokens read back.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';

// A waiter: `eventually(what, probe)` calls `probe` (sync or async) every 50 ms until it returns something truthy,
// and returns that; after `hungAfterMs` it calls `fail` with `what`. Only a hung test reaches the limit.
export function waiter(hungAfterMs, fail) {
  return async function eventually(what, probe) {
    const deadline = Date.now() + hungAfterMs;
    for (;;) {
      const v = await probe();
      if (v) return v;
      if (Date.now() > deadline) fail(`${what}: not within ${hungAfterMs / 1000} s`);
      await new Promise((r) => setTimeout(r, 50));
    }
  };
}

// A deadline: `within(what, promise)` resolves (or rejects) as `promise` does, and calls `fail` with `what` if it has
// not settled after `hungAfterMs`. Only a hung test reaches the limit.
export function deadline(hungAfterMs, fail) {
  return function within(what, promise) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => fail(`${what}: not within ${hungAfterMs / 1000} s`), hungAfterMs);
      promise.then((v) => { clearTimeout(timer); resolve(v); }, (e) => { clearTimeout(timer); reject(e); });
    });
  };
}

// One HTTP/1.1 request to 127.0.0.1:`port`; the body may be a string (sent as is) or an object (sent as JSON).
// Resolves with {status, headers, body (text), json (parsed, or null)}; rejects when no answer comes in `hungAfterMs`.
export function request(port, method, target, { token, body, contentType, headers: extra, hungAfterMs = 120000 } = {}) {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body);
    const headers = { ...extra };
    if (token) headers.authorization = `Bearer ${token}`;
    if (payload !== undefined) {
      headers['content-type'] = contentType ?? 'application/json';
      headers['content-length'] = Buffer.byteLength(payload);
    }
    const req = http.request({ host: '127.0.0.1', port, method, path: target, headers, agent: false }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let json = null;
        try { json = JSON.parse(text); } catch { /* not JSON */ }
        resolve({ status: res.statusCode, headers: res.headers, body: text, json });
      });
    });
    req.setTimeout(hungAfterMs, () => req.destroy(new Error(`${method} ${target}: no answer`)));
    req.on('error', reject);
    if (payload !== undefined) req.write(payload);
    req.end();
  });
}

// A manager.toml on loopback with ephemeral ports: guests over TCP, the admin API, host agents with `agentToken`, one
// static host "local" with `count` devices of `kind` (each with `slots` slots when > 0), and the `tenants` named. `leases` (TOML lines) go first, in
// [leases] (and may open other sections).
export function loopbackConfig({ agentToken, kind, count, slots = 0, tenants, leases = '' }) {
  return `[leases]\n${leases}[guest]\ntcp = "127.0.0.1:0"\nunix = ""\n[admin]\nlisten = "127.0.0.1:0"\n` +
    `[agents]\nlisten = ["127.0.0.1:0"]\ntoken = "${agentToken}"\n` +
    `[[hosts]]\nname = "local"\nbackend = "static"\n[[hosts.devices]]\nkind = "${kind}"\ncount = ${count}\n` +
    (slots > 0 ? `slots = ${slots}\n` : '') +
    tenants.map((t) => `[[tenants]]\nname = "${t}"\n`).join('');
}

// Starts `bin` with `config` (written to WORK/manager.toml), data in `dataDir`, output in WORK/manager.log. Resolves
// once its endpoints.json names it: {process, endpoints, tokenOf(line prefix), adminPort}. `onExit(code, log)` runs
// if it exits; `eventually(what, probe)` waits (the caller's, with its hung-test limit); `fail(message)` ends the test.
export async function startManager({ bin, config, work, dataDir, eventually, fail, onExit }) {
  fs.writeFileSync(path.join(work, 'manager.toml'), config);
  const log = path.join(work, 'manager.log');
  const child = spawn(bin, ['--config', path.join(work, 'manager.toml'), '--data-dir', dataDir],
                      { stdio: ['ignore', fs.openSync(log, 'w'), fs.openSync(log, 'a')] });
  child.on('exit', (code) => onExit(code, fs.readFileSync(log, 'utf8')));
  const endpoints = await eventually('accelpool-manager writes endpoints.json', () => {
    try {
      const e = JSON.parse(fs.readFileSync(path.join(dataDir, 'endpoints.json'), 'utf8'));
      return e.pid === child.pid ? e : null;
    } catch { return null; }
  });
  const started = fs.readFileSync(log, 'utf8');
  const tokenOf = (what) => {
    const m = started.match(new RegExp(`^${what} \\(shown once\\): (\\S+)$`, 'm'));
    if (!m) fail(`no '${what}' line in the manager's output:\n${started}`);
    return m[1];
  };
  return { process: child, endpoints, tokenOf, adminPort: Number(endpoints.admin.split(':').pop()) };
}
