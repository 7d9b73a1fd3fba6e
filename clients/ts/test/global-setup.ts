// Starts a real `plaza serve` on a free port for the whole test run, and stops it after.
import type { TestProject } from 'vitest/node';
import { startPlaza, type PlazaProcess } from './plaza-process.js';

declare module 'vitest' {
  export interface ProvidedContext {
    /** `ws://ADDR/v1/ws` of the server under test. */
    plazaWsUrl: string;
  }
}

let server: PlazaProcess | undefined;

export async function setup(project: TestProject): Promise<void> {
  server = await startPlaza(['--auto-create-rooms']);
  project.provide('plazaWsUrl', `ws://${server.addr}/v1/ws`);
}

export async function teardown(): Promise<void> {
  await server?.stop();
}
