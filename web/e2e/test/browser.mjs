// Debian's chromium through playwright-core (which never downloads a browser of its own),
// headless and quiet: the one browser setup every test here uses.
import { chromium } from 'playwright-core';

/** The browser binary; `E2E_CHROMIUM` overrides Debian's. */
export const CHROMIUM = process.env.E2E_CHROMIUM ?? '/usr/bin/chromium';

const ARGS = [
  '--no-sandbox',
  '--headless',
  '--disable-gpu',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

/**
 * Real WebRTC between two pages on this machine: fake camera and microphone (a test pattern and
 * a beep) granted without a prompt, and host candidates as plain addresses rather than mDNS
 * names (nothing resolves those here).
 */
export const MEDIA_ARGS = [
  '--use-fake-device-for-media-stream',
  '--use-fake-ui-for-media-stream',
  '--disable-features=WebRtcHideLocalIpsWithMdns',
  '--autoplay-policy=no-user-gesture-required',
];

/** Launches chromium (with `extra` arguments); close it when done. */
export function launchChromium(extra = []) {
  return chromium.launch({ executablePath: CHROMIUM, args: [...ARGS, ...extra] });
}
