// Starts a real `plaza serve` on a free port for the whole test run, and stops it after.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type { TestProject } from 'vitest/node';

declare module 'vitest' {
  export interface ProvidedContext {
    /** `ws://ADDR/v1/ws` of the server under test. */
    plazaWsUrl: string;
  }
}

const binary = fileURLToPath(new URL('../../../target/debug/plaza', import.meta.url));

let server: ChildProcess | undefined;

export async function setup(project: TestProject): Promise<void> {
  if (!existsSync(binary)) {
    throw new Error(`${binary} is missing: run \`cargo build -p plaza\` at the repository root first`);
  }
  server = spawn(binary, ['serve', '--listen', '127.0.0.1:0', '--auto-create-rooms'], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: { ...process.env, RUST_LOG: process.env['RUST_LOG'] ?? 'warn' },
  });
  const child = server;
  const addr = await new Promise<string>((resolve, reject) => {
    const lines = createInterface({ input: child.stdout! });
    child.once('exit', (code) => reject(new Error(`plaza exited early with ${code}`)));
    child.once('error', reject);
    lines.once('line', (line) => {
      const match = /open http:\/\/([^/\s]+)\//.exec(line);
      if (match?.[1]) resolve(match[1]);
      else reject(new Error(`unexpected first line from plaza: ${line}`));
    });
  });
  project.provide('plazaWsUrl', `ws://${addr}/v1/ws`);
}

export async function teardown(): Promise<void> {
  const child = server;
  if (!child || child.exitCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
  await exited;
  clearTimeout(timer);
}
