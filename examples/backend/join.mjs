// A member for trying the backend from a terminal (Node >= 20): logs in at the backend as
// NAME, joins ROOM on Plaza with the token, prints the welcome it gets, and leaves.
//   node examples/backend/join.mjs ROOM NAME
// Config by environment: PLAZA_URL (Plaza's HTTP address), BACKEND_URL (this backend's).
// Unlike server.mjs it has dependencies (`npm ci` here): the TypeScript client (@plaza/client,
// from clients/ts, built) and `ws`, because Node 20 has no global WebSocket to give it.
import { PlazaClient } from '@plaza/client';
import { WebSocket } from 'ws';

const [room, name] = process.argv.slice(2);
if (!room || !name) {
  console.error('usage: node join.mjs ROOM NAME');
  process.exit(2);
}
const plazaUrl = (process.env.PLAZA_URL ?? 'http://127.0.0.1:7700').replace(/\/+$/, '');
const backendUrl = (process.env.BACKEND_URL ?? 'http://127.0.0.1:3000').replace(/\/+$/, '');

const login = await fetch(`${backendUrl}/login`, { method: 'POST', body: JSON.stringify({ name }) });
if (!login.ok) throw new Error(`login: ${login.status} ${await login.text()}`);
const { token } = await login.json();

const client = new PlazaClient(`${plazaUrl.replace(/^http/, 'ws')}/v1/ws`, { token, WebSocket });
const lobby = await client.join(room, {});
const welcome = await new Promise((resolve) => {
  lobby.on('message', (m) => {
    if (m.from === '@server' && m.event === 'welcome') resolve(m.data);
  });
});
console.log(`${lobby.room}: ${welcome.text}`);
await lobby.leave();
client.close();
