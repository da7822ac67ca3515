/**
 * The GPUs as NVML reads them on the server's machine (`GET kiwi/api/nvml`): memory used and
 * utilization, the figures jupyterlab-nvdashboard shows, next to Kiwi's own view. Read every
 * few seconds while the panel shows; where the server says NVML is not there, asked again only
 * rarely (a driver installed later) and nothing is shown meanwhile.
 */

import { Poll } from '@lumino/polling';

/** One GPU as NVML reads it; the whole device, every process on it counted. */
export interface INvmlGpu {
  index: number;
  name: string;
  uuid: string;
  memory_used: number;
  memory_total: number;
  /** Percent of the last sample period in which a kernel ran on it; null if not reported. */
  utilization: number | null;
  /** Percent of it in which its memory was read or written; null if not reported. */
  memory_utilization: number | null;
}

export interface INvmlReading {
  nvml: boolean;
  gpus?: INvmlGpu[];
  /** Why there is no reading, when `nvml` is false. */
  reason?: string;
}

/** Milliseconds between two readings while the panel shows them. */
export const NVML_INTERVAL_MS = 2000;
/** ...and between two questions to a server that has no NVML. */
export const NO_NVML_INTERVAL_MS = 60_000;

export interface INvmlPollOptions {
  read: () => Promise<INvmlReading>;
  /** Takes each reading (the model's setNvml). */
  take: (reading: INvmlReading) => void;
  /** Whether anyone looks: readings stop while this says no. */
  shown: () => boolean;
}

/** Starts the readings; dispose the returned poll to stop them. */
export function pollNvml(options: INvmlPollOptions): Poll {
  let available = true;
  const poll: Poll = new Poll({
    factory: async () => {
      if (!options.shown()) {
        return;
      }
      const reading = await options.read();
      options.take(reading);
      if (reading.nvml !== available) {
        available = reading.nvml;
        poll.frequency = {
          ...poll.frequency,
          interval: available ? NVML_INTERVAL_MS : NO_NVML_INTERVAL_MS
        };
      }
    },
    frequency: { interval: NVML_INTERVAL_MS, backoff: true, max: NO_NVML_INTERVAL_MS },
    name: 'kiwi-jupyter:nvml',
    standby: 'when-hidden'
  });
  return poll;
}
