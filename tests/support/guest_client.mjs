// A guest of a tenant on the manager's guest TCP port, for the Node.js tests (tests/contract, tests/browser): the
// real guest protocol (docs/guest-protocol.md), newline-delimited JSON-RPC on a plain socket.
import net from 'node:net';

export class Guest {
  // Connects to 127.0.0.1:`port` and says hello as `guest` with the tenant's `token`. Rejects when the connection
  // or the hello is refused.
  static async connect(port, token, guest) {
    const g = new Guest();
    g.socket = net.connect(port, '127.0.0.1');
    g.socket.setNoDelay(true);
    g.buffer = '';
    g.waiting = new Map();  // request id -> {resolve, reject}
    g.nextId = 1;
    g.socket.on('data', (d) => {
      g.buffer += d.toString('utf8');
      for (let nl; (nl = g.buffer.indexOf('\n')) >= 0;) {
        const msg = JSON.parse(g.buffer.slice(0, nl));
        g.buffer = g.buffer.slice(nl + 1);
        if (msg.id !== undefined && g.waiting.has(msg.id)) {
          g.waiting.get(msg.id).resolve(msg);
          g.waiting.delete(msg.id);
        }
      }
    });
    await new Promise((resolve, reject) => g.socket.once('connect', resolve).once('error', reject));
    // A socket error after that fails the calls waiting for a reply.
    g.socket.on('error', (e) => {
      for (const { reject } of g.waiting.values()) reject(new Error(`guest ${guest}: ${e.message}`));
      g.waiting.clear();
    });
    const hello = await g.call('hello', { protocol: 1, token, guest });
    if (!hello.result) throw new Error(`guest ${guest}: hello refused: ${JSON.stringify(hello)}`);
    return g;
  }

  // Sends one request; resolves with its reply ({result} or {error}). Notifications are skipped.
  call(method, params) {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.waiting.set(id, { resolve, reject });
      this.socket.write(`${JSON.stringify({ jsonrpc: '2.0', id, method, params })}\n`);
    });
  }

  // Sends one request; resolves with the reply's lease (or its whole result when it has no lease), rejects with the
  // reply when it is an error.
  async lease(method, params) {
    const r = await this.call(method, params);
    if (!r.result) throw new Error(`guest ${method} failed: ${JSON.stringify(r)}`);
    return r.result.lease ?? r.result;
  }

  // Renews every lease of this guest every `everyMs` (`heartbeat {}`), as a guest must at least every TTL/3, until
  // close(); the timer keeps no process alive.
  keepAlive(everyMs) {
    this.heartbeats = setInterval(() => this.call('heartbeat', {}).catch(() => {}), everyMs);
    this.heartbeats.unref();
  }

  close() {
    clearInterval(this.heartbeats);
    this.socket.destroy();
  }
}
