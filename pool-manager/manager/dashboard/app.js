// accelpool dashboard (docs/dashboard.md). The token lives in this module's memory only and goes out as a bearer
// header: a browser never attaches it on its own, so another site cannot make calls with it (no cookie, no CSRF).
// The live view is GET /v1/events (Server-Sent Events read through fetch, which can send the header): a snapshot,
// then deltas of what the manager committed. Actions are the admin API's calls, with its checks and its errors.
'use strict';

const $ = (sel) => document.querySelector(sel);
const kPageSize = 100;           // table rows drawn at once (devices, queue): paged, however large the pool
const kQueueReadMs = 5000;       // least time between two reads of the queue's shown page (GET /v1/queue)...
const kQueueReadShare = 50;      // ...and at least this many times as long as the last read took
const kSampleMs = 2000;          // chart sampling period
const kRenderGapMs = 250;        // least time between two redraws of the live views
const kSamples = 300;            // chart history kept (10 minutes)
const kReconnectMs = 1000;       // after a stream ends, before it is opened again
const kRecentEnded = 200;        // leases kept in "ended while watching"

let token = null;
let role = null;                 // 'admin' | 'tenant'
let stream = null;               // AbortController of the open stream
let clockSkew = 0;               // server time - page time, seconds
const state = {
  summary: null, devices: new Map(), hosts: new Map(), leases: new Map(), queue: [], recent: [],
};
let view = 'overview';
let devicePage = 0;
// The queue view's page. `cursor`: the index of its first entry in the viewer's queue (the whole queue for an
// admin, its own entries for a tenant). `read`: the last page GET /v1/queue answered ({cursor, entries, total, at}).
// `readAt`, `gapMs`: when the last read ended, and how long after it the next may start.
const queueView = { cursor: 0, read: null, reading: false, readAt: -Infinity, gapMs: kQueueReadMs };
let historyCursor = null;
const samples = [];
let chartGroup = 'all';           // whose wait and JCT the charts show: 'all', 'tenant NAME' or 'bitstream NAME'

// --- sign-in and the stream -------------------------------------------------------------------------------------

function showSignedIn(on) {
  $('#sign-in').hidden = on;
  $('#app').hidden = !on;
  $('#sign-out').hidden = !on;
  $('#viewer').hidden = !on;
  $('#link').hidden = !on;
  $('#policy-now').hidden = !on;
}

async function signIn(candidate) {
  $('#sign-in-error').textContent = '';
  const opened = await openStream(candidate);
  if (opened !== true) {
    $('#sign-in-error').textContent = `Sign-in failed: ${opened}`;
    return;
  }
  token = candidate;
  $('#token').value = '';
  showSignedIn(true);
}

function signOut() {
  token = null;
  role = null;
  if (stream) stream.abort();
  stream = null;
  state.devices.clear(); deviceNames = null; deviceRows.clear(); hostRows.clear(); state.hosts.clear(); state.leases.clear(); state.queue = []; state.recent = [];
  Object.assign(queueView, { cursor: 0, read: null, readAt: -Infinity, gapMs: kQueueReadMs });
  samples.length = 0;
  for (const body of document.querySelectorAll('tbody')) body.replaceChildren();  // nothing of this viewer stays
  $('#chart-group').replaceChildren(el('option', { value: 'all' }, 'the whole pool'));
  chartGroup = 'all';
  document.body.classList.remove('tenant', 'admin');
  showSignedIn(false);
  $('#token').focus();
}

// Opens GET /v1/events with `candidate`; resolves true once the answer is 200 (events then flow in the
// background), or with the reason it was refused.
async function openStream(candidate) {
  const ctl = new AbortController();
  let res;
  try {
    res = await fetch('/v1/events', { headers: { Authorization: `Bearer ${candidate}` }, cache: 'no-store', signal: ctl.signal });
  } catch (e) {
    return `the manager cannot be reached (${e.message})`;
  }
  if (!res.ok) {
    let why = `HTTP ${res.status}`;
    try { why = (await res.json()).error.message; } catch (e) { /* not JSON: keep the status */ }
    return why;
  }
  if (stream) stream.abort();
  stream = ctl;
  readEvents(res, ctl, candidate);
  return true;
}

async function readEvents(res, ctl, candidate) {
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  setLink('live');
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        handleEvent(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
      }
    }
  } catch (e) { /* aborted or cut: below */ }
  if (stream !== ctl || token !== candidate) return;  // signed out, or replaced
  setLink('reconnecting');
  setTimeout(async () => {
    if (token !== candidate) return;
    const again = await openStream(candidate);
    if (again !== true) {
      setLink('disconnected');
      say(`Live view stopped: ${again}`, true);
    }
  }, kReconnectMs);
}

function setLink(text) {
  const link = $('#link');
  link.textContent = text;
  link.dataset.link = text;
}

function handleEvent(block) {
  let event = 'message';
  let data = '';
  for (const line of block.split('\n')) {
    if (line.startsWith('event: ')) event = line.slice(7);
    else if (line.startsWith('data: ')) data += line.slice(6);
  }
  if (!data) return;
  const msg = JSON.parse(data);
  if (event === 'snapshot') applySnapshot(msg);
  else if (event === 'delta') applyDelta(msg);
  scheduleRender();
}

// Every device's name in the table's order, kept until a device joins or leaves (live updates of a device's state
// do not re-sort the pool).
let deviceNames = null;
function sortedDeviceNames() {
  if (!deviceNames) deviceNames = [...state.devices.keys()].sort();
  return deviceNames;
}

function applySnapshot(msg) {
  role = msg.viewer.role;
  document.body.classList.toggle('tenant', role === 'tenant');
  document.body.classList.toggle('admin', role === 'admin');
  $('#viewer').textContent = role === 'admin' ? 'admin' : `tenant ${msg.viewer.tenant}`;
  state.devices = new Map(msg.devices.map((d) => [d.name, d]));
  deviceNames = null;
  state.hosts = new Map(msg.hosts.map((h) => [h.name, h]));
  state.leases = new Map(msg.leases.map((l) => [l.id, l]));
  state.queue = msg.queue;
  setSummary(msg.summary);
  if (role === 'tenant' && view === 'bitstreams') showView('overview');
  sample();
}

function applyDelta(msg) {
  // Returns whether an item joined or left (not only changed).
  const merge = (map, part, key) => {
    const before = map.size;
    let joined = false;
    for (const item of part.upsert) {
      joined = joined || !map.has(item[key]);
      map.set(item[key], item);
    }
    for (const gone of part.remove) map.delete(gone);
    return joined || map.size !== before;
  };
  if (merge(state.devices, msg.devices, 'name')) deviceNames = null;
  merge(state.hosts, msg.hosts, 'name');
  merge(state.leases, msg.leases, 'id');
  for (const l of msg.leases.ended) state.recent.unshift(l);
  state.recent.length = Math.min(state.recent.length, kRecentEnded);
  if (msg.queue) state.queue = msg.queue;
  setSummary(msg.summary);
}

function setSummary(summary) {
  state.summary = summary;
  clockSkew = summary.now - Date.now() / 1000;
  // Written only when it changed: every change to the page costs a layout, and deltas arrive hundreds a second.
  setText($('#policy-now'), `policy ${summary.policy}`);
  const input = $('#policy');
  if (document.activeElement !== input && input.value !== summary.policy) input.value = summary.policy;
}

// --- calls ------------------------------------------------------------------------------------------------------

// Calls the admin API; says what happened in the status line. Resolves with the parsed answer, or null on an error.
async function call(method, path, body) {
  const headers = { Authorization: `Bearer ${token}` };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let res;
  try {
    res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: 'no-store' });
  } catch (e) {
    say(`${method} ${path}: the manager cannot be reached (${e.message})`, true);
    return null;
  }
  let answer = null;
  try { answer = await res.json(); } catch (e) { /* no JSON body */ }
  if (!res.ok) {
    say(`${method} ${path}: ${answer && answer.error ? answer.error.message : `HTTP ${res.status}`}`, true);
    return null;
  }
  return answer;
}

function setText(element, text) {
  if (element.textContent !== text) element.textContent = text;
}

function say(text, bad = false) {
  const s = $('#status');
  s.textContent = text;
  s.classList.toggle('bad', bad);
}

async function action(method, path, body, done) {
  const answer = await call(method, path, body);
  if (answer) say(done);
  return answer;
}

const enc = (name) => name.split('/').map(encodeURIComponent).join('/');

// --- rendering --------------------------------------------------------------------------------------------------

// Draws at the next frame, at most once per kRenderGapMs: a busy pool sends thousands of changes a second, and a
// person reads a table a few times a second, not sixty.
let renderQueued = false;
let lastRender = -Infinity;
function scheduleRender() {
  if (renderQueued) return;
  renderQueued = true;
  const draw = () => requestAnimationFrame(() => { renderQueued = false; lastRender = performance.now(); render(); });
  const wait = lastRender + kRenderGapMs - performance.now();
  if (wait > 0) setTimeout(draw, wait);
  else draw();
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('data-')) e.setAttribute(k, v);
    else if (k === 'onclick') e.addEventListener('click', v);
    else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c ?? ''));
  return e;
}

const stateTag = (s) => el('span', { class: `state ${s}` }, s);
const button = (label, act, onclick, disabled = false) => el('button', { type: 'button', 'data-action': act, onclick, disabled }, label);
const now = () => Date.now() / 1000 + clockSkew;

function duration(s) {
  if (s === null || s === undefined || !isFinite(s)) return '';
  if (s < 60) return `${s.toFixed(1)} s`;
  if (s < 3600) return `${(s / 60).toFixed(1)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function render() {
  if (!state.summary) return;
  if (view === 'overview') renderOverview();
  if (view === 'devices') renderDevices();
  if (view === 'queue') renderQueue();
  if (view === 'leases') renderLeases();
}

function counts() {
  let busy = 0, usable = 0;
  for (const d of state.devices.values()) {
    if (d.state === 'leased') busy++;
    if (d.state !== 'unavailable') usable++;
  }
  return { busy, usable };
}

function renderOverview() {
  const s = state.summary;
  const { busy, usable } = counts();
  const card = (n, l, id) => el('div', { class: 'card', 'data-card': id }, el('div', { class: 'n' }, String(n)), el('div', { class: 'l' }, l));
  $('#cards').replaceChildren(
    card(`${busy} / ${state.devices.size}`, 'devices busy / all', 'busy'),
    card(usable, 'devices usable', 'usable'),
    card(state.hosts.size, 'hosts', 'hosts'),
    card(s.queue_length, 'waiting requests (pool)', 'queue'),
    card(state.leases.size, 'live leases shown', 'live'),
    card(s.counters.grants, 'grants', 'grants'),
    card(s.counters.reprogrammings, 'reprogrammings', 'reprogrammings'),
    card(s.counters.preemptions, 'preemptions', 'preemptions'));
  const rows = [];
  const group = (name, g) => rows.push(el('tr', {}, el('th', { scope: 'row' }, name), el('td', {}, String(g.wait_s.count)),
    ...[g.wait_s.avg, g.wait_s.p50, g.wait_s.p99, g.jct_s.avg, g.jct_s.p50, g.jct_s.p99].map((v) => el('td', {}, duration(v))))); 
  for (const [key, g] of statGroups(s.stats)) group(key, g);
  fill($('#stats-table tbody'), rows);
  drawCharts();
}

function sample() {
  if (!state.summary) return;
  const s = state.summary;
  const groups = {};
  for (const [key, g] of statGroups(s.stats)) {
    groups[key] = { wait: [g.wait_s.avg, g.wait_s.p50, g.wait_s.p99], jct: [g.jct_s.avg, g.jct_s.p50, g.jct_s.p99] };
  }
  samples.push({
    t: now(), busy: counts().busy, queue: s.queue_length, groups,
    events: [s.counters.reprogrammings, s.counters.preemptions],
  });
  if (samples.length > kSamples) samples.shift();
  updateChartGroups();
  if (view === 'overview') drawCharts();
}

// The statistics' groups as [key, group]: the whole pool, each tenant, each bitstream.
function statGroups(stats) {
  return [['all', stats.all],
    ...Object.entries(stats.by_tenant || {}).map(([t, g]) => [`tenant ${t}`, g]),
    ...Object.entries(stats.by_bitstream || {}).map(([b, g]) => [`bitstream ${b || '(any)'}`, g])];
}

// Offers every group seen in the charts' history in the chart selector.
function updateChartGroups() {
  const select = $('#chart-group');
  const known = new Set([...select.options].map((o) => o.value));
  for (const x of samples) {
    for (const key of Object.keys(x.groups)) {
      if (!known.has(key)) { select.append(el('option', { value: key }, key)); known.add(key); }
    }
  }
}

const svgNs = 'http://www.w3.org/2000/svg';
function svg(tag, attrs) {
  const e = document.createElementNS(svgNs, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

// Draws `series` (arrays of numbers, one per sample) as lines in `chart`, scaled to the largest value.
function drawLines(chart, series, classes) {
  const w = 300, h = 100, pad = 2;
  chart.setAttribute('viewBox', `0 0 ${w} ${h + 12}`);
  chart.setAttribute('preserveAspectRatio', 'none');
  const max = Math.max(1e-9, ...series.flat().filter((v) => isFinite(v)));
  const parts = [svg('line', { class: 'axis', x1: 0, y1: h, x2: w, y2: h })];
  series.forEach((values, i) => {
    if (values.length === 0) return;
    const step = values.length > 1 ? w / (values.length - 1) : 0;
    const points = values.map((v, j) => `${(j * step).toFixed(1)},${(h - pad - (v / max) * (h - 2 * pad)).toFixed(1)}`);
    parts.push(svg('polyline', { class: classes[i], points: points.join(' ') }));
  });
  const label = svg('text', { x: 2, y: h + 11 });
  label.textContent = `max ${Number.isInteger(max) ? max : max.toFixed(2)}`;
  parts.push(label);
  chart.replaceChildren(...parts);
}

function drawCharts() {
  const col = (f) => samples.map(f);
  drawLines($('#chart-busy'), [col((x) => x.busy)], ['s1']);
  drawLines($('#chart-queue'), [col((x) => x.queue)], ['s1']);
  // A group without leases in a sample's window has no figures then: the line shows 0.
  const of = (x, what, i) => (x.groups[chartGroup] ? x.groups[chartGroup][what][i] : 0);
  drawLines($('#chart-wait'), [0, 1, 2].map((i) => col((x) => of(x, 'wait', i))), ['s1', 's2', 's3']);
  drawLines($('#chart-jct'), [0, 1, 2].map((i) => col((x) => of(x, 'jct', i))), ['s1', 's2', 's3']);
  for (const name of document.querySelectorAll('.chart-group-name')) name.textContent = chartGroup === 'all' ? 'whole pool' : chartGroup;
  drawLines($('#chart-events'), [0, 1].map((i) => col((x) => x.events[i])), ['s1', 's4']);
}

// Table rows kept between redraws by id: a row is built again only when what it shows (its key) changed, and
// keepRows puts only changed rows in the table, so a redraw on a busy pool touches a few rows, not the page.
const deviceRows = new Map();  // device name -> { key, tr }
const hostRows = new Map();    // host name -> { key, tr }
function keptRow(rows, id, shown, build) {
  const key = JSON.stringify(shown);
  const kept = rows.get(id);
  if (kept && kept.key === key) return kept.tr;
  const tr = build();
  rows.set(id, { key, tr });
  return tr;
}

function deviceRow(d, admin) {
  return keptRow(deviceRows, d.name, [d.kind, d.model, d.state, d.loaded, d.lease, d.available, d.draining, admin], () => el('tr', { 'data-device': d.name },
    el('th', { scope: 'row' }, d.name), el('td', {}, d.kind), el('td', {}, d.model), el('td', {}, stateTag(d.state)),
    el('td', {}, d.loaded || '—'), el('td', { 'data-lease-cell': '' }, d.lease === null ? '' : String(d.lease)),
    el('td', {}, d.available ? 'ok' : 'failed'), el('td', {}, d.draining ? 'yes' : 'no'),
    admin ? el('td', { class: 'actions' },
      button('Drain', 'drain', () => action('POST', `/v1/devices/${enc(d.name)}/drain`, {}, `device ${d.name} drained`), d.draining),
      button('Undrain', 'undrain', () => action('POST', `/v1/devices/${enc(d.name)}/undrain`, {}, `device ${d.name} undrained`), !d.draining),
      button('Reset', 'reset', () => action('POST', `/v1/devices/${enc(d.name)}/reset`, {}, `device ${d.name} reset`), d.state === 'leased')) : ''));
}

function hostRow(h, admin) {
  return keptRow(hostRows, h.name, [h.connected, h.draining, h.device_count, admin], () => el('tr', { 'data-host': h.name },
    el('th', { scope: 'row' }, h.name), el('td', {}, h.connected ? 'yes' : 'no'), el('td', {}, h.draining ? 'yes' : 'no'),
    el('td', {}, String(h.device_count)),
    admin ? el('td', { class: 'actions' },
      button('Drain', 'drain', () => action('POST', `/v1/hosts/${enc(h.name)}/drain`, {}, `host ${h.name} drained`), h.draining),
      button('Undrain', 'undrain', () => action('POST', `/v1/hosts/${enc(h.name)}/undrain`, {}, `host ${h.name} undrained`), !h.draining)) : ''));
}

// Makes `tbody` hold exactly `rows`, in order, moving only the rows not already in place.
function keepRows(tbody, rows) {
  const wanted = new Set(rows);
  for (const row of [...tbody.children]) {
    if (!wanted.has(row)) row.remove();
  }
  rows.forEach((row, i) => {
    const at = tbody.children[i];
    if (at !== row) tbody.insertBefore(row, at ?? null);
  });
}

function renderDevices() {
  const admin = role === 'admin';
  keepRows($('#hosts-table tbody'), [...state.hosts.values()].map((h) => hostRow(h, admin)));
  const filter = $('#device-filter').value.trim().toLowerCase();
  // Without a filter only the page's devices are looked at: a live update on a large pool neither sorts nor scans
  // every device.
  const matches = (d) => [d.name, d.kind, d.model, d.state, d.loaded].some((v) => (v || '').toLowerCase().includes(filter));
  const all = filter ? sortedDeviceNames().filter((n) => matches(state.devices.get(n))) : sortedDeviceNames();
  const pages = Math.max(1, Math.ceil(all.length / kPageSize));
  devicePage = Math.min(devicePage, pages - 1);
  const shown = all.slice(devicePage * kPageSize, (devicePage + 1) * kPageSize).map((n) => state.devices.get(n));
  keepRows($('#devices-table tbody'), shown.map((d) => deviceRow(d, admin)));
  const pager = $('#devices-pager');
  const pagerKey = `${devicePage} ${pages} ${all.length}`;
  if (pager.dataset.key === pagerKey) return;  // unchanged: not drawn again
  pager.dataset.key = pagerKey;
  pager.replaceChildren(
    el('button', { type: 'button', disabled: devicePage === 0, onclick: () => { devicePage--; renderDevices(); } }, 'Previous'),
    el('span', {}, `page ${devicePage + 1} of ${pages} (${all.length} devices)`),
    el('button', { type: 'button', disabled: devicePage >= pages - 1, onclick: () => { devicePage++; renderDevices(); } }, 'Next'));
}

// Where the queue view's rows come from. The stream carries the queue's head live: an admin's first page always,
// a tenant's first page when its entries there fill the page or are all it has (the stream looks for them among the
// queue's first 2,000 only). Every other page is read from GET /v1/queue when it is shown, then again while the view
// shows it (a tenant's first page too, for its total), at most every kQueueReadMs and never sooner than
// kQueueReadShare times the last read's duration after it: a page left open takes at most 1/kQueueReadShare of the
// manager's time (a page deep in a queue of 100,000 takes it 30-130 ms to answer, a tenant's 0.2-0.5 s:
// docs/dashboard.md), and the table never holds more than a page.
function queueIsLive() {
  if (queueView.cursor !== 0) return false;
  return role === 'admin' || state.queue.length >= Math.min(kPageSize, queueTotal());
}
const queueReads = () => role === 'tenant' || queueView.cursor > 0;
// How many entries the viewer's queue holds: the pool's live total for an admin, the last read's for a tenant.
function queueTotal() {
  if (role === 'admin') return state.summary.queue_length;
  return queueView.read ? queueView.read.total : state.queue.length;
}

// Reads the page at the view's cursor, unless one was read less than kQueueReadMs ago (`atOnce`: read now). One read
// at a time; an answer for another viewer is dropped, and one for another cursor is followed by a read of the new.
async function readQueuePage(atOnce) {
  if (queueView.reading || (!atOnce && performance.now() - queueView.readAt < queueView.gapMs)) return;
  const asked = { token, cursor: queueView.cursor };
  queueView.reading = true;
  const start = performance.now();
  const page = await call('GET', `/v1/queue?limit=${kPageSize}&cursor=${asked.cursor}`);
  queueView.reading = false;
  if (token !== asked.token) return;
  queueView.readAt = performance.now();
  queueView.gapMs = Math.max(kQueueReadMs, kQueueReadShare * (queueView.readAt - start));
  if (queueView.cursor !== asked.cursor) return readQueuePage(true);
  if (!page) return;  // call() said why in the status line; read again later
  queueView.read = { cursor: asked.cursor, entries: page.queue, total: page.total, at: new Date() };
  // The queue got shorter than where the page starts: its last page instead.
  if (page.queue.length === 0 && asked.cursor > 0) return showQueuePage(page.total - kPageSize);
  if (view === 'queue') renderQueue();
}

// Shows the page of the queue that starts at index `cursor` of the viewer's queue (kept within the queue).
function showQueuePage(cursor) {
  queueView.cursor = Math.max(0, Math.min(Math.floor(cursor), queueTotal() - 1));
  if (queueReads()) readQueuePage(true);
  renderQueue();
}

function renderQueue() {
  if (queueReads()) readQueuePage(false);
  const t = now();
  const total = queueTotal();
  const live = queueIsLive();
  const read = queueView.read;
  const entries = live ? state.queue.slice(0, kPageSize) : read && read.cursor === queueView.cursor ? read.entries : null;
  const pool = state.summary.queue_length;
  setText($('#queue-total'), role === 'admin' ? `${pool} waiting.` : `${total} of yours waiting; ${pool} waiting in the pool.`);
  const from = queueView.cursor + 1;
  let range = 'none waiting';
  if (!entries) range = `reading entries from ${from}…`;
  else if (entries.length) {
    range = `entries ${from}–${queueView.cursor + entries.length} of ${total}` +
      (live ? ', live' : `, as read at ${read.at.toLocaleTimeString()}`);
  }
  setText($('#queue-range'), range);
  const first = queueView.cursor === 0, last = queueView.cursor + kPageSize >= total;
  for (const [id, off] of [['#queue-first', first], ['#queue-previous', first], ['#queue-next', last]]) {
    if ($(id).disabled !== off) $(id).disabled = off;
  }
  setText($('#queue-at-label'), role === 'admin' ? 'Go to position' : 'Go to your entry');
  $('#queue-at').max = String(Math.max(1, total));
  fill($('#queue-table tbody'), (entries ?? []).map((l) => el('tr', { 'data-lease': String(l.id), 'data-position': String(l.position) },
    el('td', {}, String(l.position)), el('th', { scope: 'row' }, String(l.id)), el('td', {}, l.tenant), el('td', {}, l.guest),
    el('td', {}, l.kind), el('td', {}, String(l.count)), el('td', {}, l.bitstream || '(any)'),
    el('td', {}, duration(t - l.created_at)), el('td', {}, l.estimate_s === null ? '' : duration(l.estimate_s)),
    el('td', { 'data-expected-start': '' }, expectedStart(l.expected_start, t)))));
}

// When the scheduler expects a waiting request to start (only where it has an estimate), from now.
function expectedStart(at, t) {
  if (at === null || at === undefined) return '';
  return at <= t ? 'now' : `in ${duration(at - t)}`;
}

function renderLeases() {
  const t = now();
  const admin = role === 'admin';
  const live = [...state.leases.values()].sort((a, b) => a.id - b.id);
  fill($('#live-table tbody'), live.map((l) => el('tr', { 'data-lease': String(l.id) },
    el('th', { scope: 'row' }, String(l.id)), el('td', {}, stateTag(l.state)), el('td', {}, l.tenant), el('td', {}, l.guest),
    el('td', {}, l.devices.join(', ')), el('td', {}, l.bitstream || '(any)'), el('td', {}, duration(t - l.granted_at)),
    admin ? el('td', { class: 'actions' }, button('Revoke', 'revoke', () => action('POST', `/v1/leases/${l.id}/revoke`,
      { reason: 'revoked from the dashboard' }, `lease ${l.id} revoked`), l.state !== 'granted')) : '')));
  fill($('#recent-table tbody'), state.recent.map((l) => el('tr', { 'data-lease': String(l.id) },
    el('th', { scope: 'row' }, String(l.id)), el('td', {}, stateTag(l.state)), el('td', {}, l.tenant), el('td', {}, l.guest),
    el('td', {}, l.devices.join(', ')), el('td', {}, l.end_reason))));
}

async function loadHistory(fromStart) {
  if (fromStart) historyCursor = null;
  const q = new URLSearchParams({ all: 'true', order: 'desc', limit: String(kPageSize) });
  for (const [id, key] of [['#h-state', 'state'], ['#h-tenant', 'tenant'], ['#h-guest', 'guest'], ['#h-device', 'device']]) {
    const v = $(id).value.trim();
    if (v) q.set(key, v);
  }
  if (historyCursor !== null) q.set('cursor', String(historyCursor));
  const page = await call('GET', `/v1/leases?${q}`);
  if (!page) return;
  fill($('#history-table tbody'), page.leases.map((l) => el('tr', { 'data-lease': String(l.id) },
    el('th', { scope: 'row' }, String(l.id)), el('td', {}, stateTag(l.state)), el('td', {}, l.tenant), el('td', {}, l.guest),
    el('td', {}, l.kind), el('td', {}, l.devices.join(', ')),
    el('td', {}, l.granted_at ? duration(l.granted_at - l.created_at) : ''),
    el('td', {}, l.ended_at && l.granted_at ? duration(l.ended_at - l.granted_at) : ''), el('td', {}, l.end_reason))));
  historyCursor = page.next_cursor;
  $('#history-next').disabled = historyCursor === null;
}

async function loadBitstreams() {
  const list = await call('GET', '/v1/bitstreams');
  if (!list) return;
  fill($('#bitstreams-table tbody'), list.bitstreams.map((b) => el('tr', { 'data-bitstream': b.name },
    el('th', { scope: 'row' }, b.name), el('td', {}, b.version || ''), el('td', {}, b.kind || ''),
    el('td', {}, b.size_bytes === undefined ? '' : `${b.size_bytes} B`), el('td', {}, b.loaded_on.join(', ')),
    el('td', {}, b.leases.join(', ')),
    el('td', { class: 'actions' }, b.registered ? button('Delete', 'delete', async () => {
      if (await action('DELETE', `/v1/bitstreams/${encodeURIComponent(b.name)}/${encodeURIComponent(b.version)}`, undefined,
        `bitstream ${b.name} ${b.version} deleted`)) loadBitstreams();
    }) : 'not in the registry'))));
}

async function upload(event) {
  event.preventDefault();
  const file = $('#upload-file').files[0];
  if (!file) return;
  const bytes = new Uint8Array(await file.arrayBuffer());
  let binary = '';
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  const added = await action('POST', '/v1/bitstreams', { manifest: $('#upload-manifest').value, content_base64: btoa(binary) },
    `bitstream ${file.name} uploaded`);
  if (added) loadBitstreams();
}

function showView(name) {
  view = name;
  for (const b of document.querySelectorAll('.tabs button')) {
    if (b.dataset.view === name) b.setAttribute('aria-current', 'page');
    else b.removeAttribute('aria-current');
  }
  for (const s of document.querySelectorAll('.view')) s.hidden = s.id !== `view-${name}`;
  if (name === 'leases' && role === 'admin') loadHistory(true);
  if (name === 'bitstreams') loadBitstreams();
  render();
}

// --- wiring -----------------------------------------------------------------------------------------------------

document.addEventListener('DOMContentLoaded', () => {
  $('#sign-in-form').addEventListener('submit', (e) => { e.preventDefault(); signIn($('#token').value.trim()); });
  $('#sign-out').addEventListener('click', signOut);
  for (const b of document.querySelectorAll('.tabs button')) b.addEventListener('click', () => showView(b.dataset.view));
  $('#chart-group').addEventListener('change', () => { chartGroup = $('#chart-group').value; drawCharts(); });
  $('#device-filter').addEventListener('input', () => { devicePage = 0; renderDevices(); });
  $('#policy-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    const policy = $('#policy').value.trim();
    const answer = await action('PUT', '/v1/policy', { policy }, `policy switched to ${policy}`);
    if (answer) $('#policy').blur();
  });
  $('#history-form').addEventListener('submit', (e) => { e.preventDefault(); loadHistory(true); });
  $('#queue-first').addEventListener('click', () => showQueuePage(0));
  $('#queue-previous').addEventListener('click', () => showQueuePage(queueView.cursor - kPageSize));
  $('#queue-next').addEventListener('click', () => showQueuePage(queueView.cursor + kPageSize));
  $('#queue-jump').addEventListener('submit', (e) => { e.preventDefault(); showQueuePage(Number($('#queue-at').value) - 1); });
  $('#history-first').addEventListener('click', () => loadHistory(true));
  $('#history-next').addEventListener('click', () => loadHistory(false));
  $('#bitstreams-refresh').addEventListener('click', loadBitstreams);
  $('#upload-form').addEventListener('submit', upload);
  setInterval(() => { sample(); if (view === 'queue' || view === 'leases') render(); }, kSampleMs);
  $('#token').focus();
});
