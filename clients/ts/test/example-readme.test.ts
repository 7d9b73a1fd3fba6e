// examples/backend/README.md is run, not read: its `sh` blocks, extracted from the README as
// they stand, in one bash from the repository root, with only the settings the README itself
// offers (BIN, SERVE_PORT, BACKEND_PORT, WORK) pointed elsewhere. The outcome it shows
// (the room, the welcome printed by join.mjs, the mirror) must come out.
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect, it, onTestFinished } from 'vitest';
import { freePort } from './helpers.js';

const root = fileURLToPath(new URL('../../../', import.meta.url));
const readme = join(root, 'examples/backend/README.md');

/** The bodies of the README's fenced `sh` blocks, in order. */
function shBlocks(markdown: string): string[] {
  return [...markdown.matchAll(/^```sh\n([\s\S]*?)^```$/gm)].map((m) => m[1]!);
}

it('examples/backend/README.md: its commands, as written, start Plaza and the backend, and a member is welcomed', async () => {
  // The README builds the client only when it is missing, with `npm ci` here: not under a
  // running vitest.
  expect(existsSync(join(root, 'clients/ts/dist/index.js')), 'run `npm run build` in clients/ts first').toBe(true);
  const blocks = shBlocks(readFileSync(readme, 'utf8'));
  expect(blocks.length).toBeGreaterThanOrEqual(5);
  const work = mkdtempSync(join(tmpdir(), 'plaza-example-readme-'));
  onTestFinished(() => rmSync(work, { recursive: true, force: true }));

  const script = blocks.join('\n');
  const child = spawn('bash', ['-euo', 'pipefail', '-c', script], {
    cwd: root,
    // Its own process group: if the script fails halfway, what it started in the background goes too.
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: {
      ...process.env,
      BIN: 'target/debug/plaza',
      SERVE_PORT: String(await freePort()),
      BACKEND_PORT: String(await freePort()),
      WORK: work,
      RUST_LOG: 'warn',
    },
  });
  onTestFinished(() => {
    try {
      process.kill(-child.pid!, 'SIGKILL');
    } catch {
      // Ended already, with everything it started.
    }
  });
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));

  expect(code, `the README's commands failed:\n${stdout}\n${stderr}`).toBe(0);
  expect(stdout).toMatch(/^\{"id":"lobby",/m);
  expect(stdout).toMatch(/^lobby: Welcome, Ann$/m);
  const mirror = JSON.parse(readFileSync(join(work, 'mirrors/lobby.json'), 'utf8')) as unknown;
  expect(mirror).toEqual({ room: 'lobby', seq: 0, entities: {} });
}, 120_000);
