/**
 * Text for numbers, the way the Python side writes them (`jupyter_gpu.rendering.units`), so a value in a column
 * reads exactly like the same value inside a server-made summary ("20.5 GiB", "3 h").
 *
 * Pure: no DOM, no JupyterLab import (compiled and tested under plain Node).
 */

/** What every missing reading is shown as: never 0. */
export const NOT_AVAILABLE = 'n/a';

const BYTE_UNITS: ReadonlyArray<readonly [number, string]> = [
  [2 ** 40, 'TiB'],
  [2 ** 30, 'GiB'],
  [2 ** 20, 'MiB'],
  [2 ** 10, 'KiB']
];

function isNumber(value: number | null | undefined): value is number {
  return typeof value === 'number' && Number.isFinite(value);
}

/**
 * `value.toFixed(digits)` rounded the way Python's `f"{value:.{digits}f}"` rounds (digits 0 or 1).
 *
 * Both round the exact binary value correctly; they differ only on an exact tie, where Python picks the
 * even digit and JavaScript the larger one. With 0 digits a tie is a fraction of exactly .5; with 1 digit
 * only .25 and .75 can be exact ties, and only .25 differs (Python "x.2", JavaScript "x.3").
 */
export function pyFixed(value: number, digits: 0 | 1): string {
  const magnitude = Math.abs(value);
  const whole = Math.floor(magnitude);
  const fraction = magnitude - whole; // exact for a double
  let text = magnitude.toFixed(digits);
  if (digits === 0 && fraction === 0.5) {
    text = String(whole % 2 === 0 ? whole : whole + 1);
  } else if (digits === 1 && fraction === 0.25) {
    text = `${whole}.2`;
  }
  return (value < 0 ? '-' : '') + text;
}

/** `22000000000` -> `"20.5 GiB"`, `629145600` -> `"600.0 MiB"`, `null` -> `"n/a"` (like `format_bytes`). */
export function formatBytes(count: number | null | undefined): string {
  if (!isNumber(count)) {
    return NOT_AVAILABLE;
  }
  const sign = count < 0 ? '-' : '';
  const magnitude = Math.abs(count);
  for (const [scale, unit] of BYTE_UNITS) {
    if (magnitude >= scale) {
      return `${sign}${pyFixed(magnitude / scale, 1)} ${unit}`;
    }
  }
  return `${sign}${Math.trunc(magnitude)} B`;
}

/** `10800` -> `"3 h"`, `124` -> `"2 min"` (like `format_duration`). */
export function formatDuration(seconds: number | null | undefined): string {
  if (!isNumber(seconds)) {
    return NOT_AVAILABLE;
  }
  const s = Math.max(seconds, 0);
  if (s < 90) {
    return `${pyFixed(s, 0)} s`;
  }
  if (s < 90 * 60) {
    return `${pyFixed(s / 60, 0)} min`;
  }
  const hours = s / 3600;
  if (hours < 48) {
    return hours < 10 ? `${pyFixed(hours, 1)} h`.replace('.0 h', ' h') : `${pyFixed(hours, 0)} h`;
  }
  return `${pyFixed(hours / 24, 0)} d`;
}

/** `41.6` -> `"42 %"`. */
export function formatPercent(value: number | null | undefined): string {
  return isNumber(value) ? `${pyFixed(value, 0)} %` : NOT_AVAILABLE;
}

/** `"20.5 GiB / 80.0 GiB"`; `"n/a"` when the used memory is unknown. */
export function formatMemory(used: number | null | undefined, total: number | null | undefined): string {
  if (!isNumber(used)) {
    return NOT_AVAILABLE;
  }
  return isNumber(total) ? `${formatBytes(used)} / ${formatBytes(total)}` : formatBytes(used);
}

/** `"212 W / 400 W"`, `"212 W"` without a limit, `"n/a"` without a reading. */
export function formatPower(watts: number | null | undefined, limit: number | null | undefined): string {
  if (!isNumber(watts)) {
    return NOT_AVAILABLE;
  }
  return isNumber(limit) ? `${pyFixed(watts, 0)} W / ${pyFixed(limit, 0)} W` : `${pyFixed(watts, 0)} W`;
}

/** `"49 °C"`. */
export function formatTemperature(celsius: number | null | undefined): string {
  return isNumber(celsius) ? `${pyFixed(celsius, 0)} °C` : NOT_AVAILABLE;
}

/** `"1410 MHz"`. */
export function formatClock(mhz: number | null | undefined): string {
  return isNumber(mhz) ? `${pyFixed(mhz, 0)} MHz` : NOT_AVAILABLE;
}

/** A PCIe rate in binary units: `"913.1 MiB/s"`. */
export function formatRate(bytesPerSecond: number | null | undefined): string {
  return isNumber(bytesPerSecond) ? `${formatBytes(bytesPerSecond)}/s` : NOT_AVAILABLE;
}

/** How long a chart spans: `"last 45 s"`, `"last 10 min"`. */
export function formatSpan(seconds: number): string {
  return `last ${formatDuration(seconds)}`;
}
