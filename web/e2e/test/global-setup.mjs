// Starts a real `plaza serve` on a free port for the whole test run, and stops it after
// (as clients/ts/test/global-setup.ts does).
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const binary = fileURLToPath(new URL('../../../target/debug/plaza', import.meta.url));

let server;

export async function setup(project) {
  if (!existsSync(binary)) {
    throw new Error(`${binary} is missing: run \`cargo build -p plaza\` at the repository root first`);
  }
  server = spawn(binary, ['serve', '--listen', '127.0.0.1:0', '--auto-create-rooms'], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: { ...process.env, RUST_LOG: process.env.RUST_LOG ?? 'warn' },
  });
  const child = server;
  const addr = await new Promise((resolve, reject) => {
    const lines = createInterface({ input: child.stdout });
    child.once('exit', (code) => reject(new Error(`plaza exited early with ${code}`)));
    child.once('error', reject);
    lines.once('line', (line) => {
      const match = /open http:\/\/([^/\s]+)\//.exec(line);
      if (match?.[1]) resolve(match[1]);
      else reject(new Error(`unexpected first line from plaza: ${line}`));
    });
  });
  // `plazaAddr` is host:port, e.g. 127.0.0.1:40123.
  project.provide('plazaAddr', addr);
}

export async function teardown() {
  const child = server;
  if (!child || child.exitCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
  await exited;
  clearTimeout(timer);
}
