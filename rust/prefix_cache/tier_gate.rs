//! The tiers' reuse gate: a bounded, decaying count of how often each block key was seen
//! (stored or hit in the device), so that only blocks seen `min_seen` times go below the
//! device ([`super::tiers`]).

use crate::error::Result;
use crate::invalid;
use crate::prefix_cache::tier_order::TierKey;

/// The reuse gate: a block goes below the device only once its key was seen `min_seen`
/// times; every count halves after `half_life` observations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateConfig {
    pub min_seen: u32,
    pub half_life: u64,
}

/// A bounded count of recent sightings per key: four rows of 8-bit counters indexed by
/// independent hashes (a count-min sketch; the minimum over rows never undercounts),
/// all halved after every `half_life` observations.
#[derive(Clone, Debug)]
pub struct Gate {
    cfg: GateConfig,
    rows: Vec<u8>,
    width: usize,
    observed: u64,
}

const GATE_ROWS: usize = 4;

impl Gate {
    pub fn new(cfg: GateConfig, width: usize) -> Result<Self> {
        if cfg.half_life == 0 || cfg.min_seen == 0 || cfg.min_seen > 255 {
            return Err(invalid!("gate: min_seen must be in 1..=255 and half_life >= 1, got {} and {}", cfg.min_seen, cfg.half_life));
        }
        let width = width.next_power_of_two().max(64);
        Ok(Self { cfg, rows: vec![0; GATE_ROWS * width], width, observed: 0 })
    }

    fn cells(&self, key: &TierKey) -> [usize; GATE_ROWS] {
        const MUL: [u64; GATE_ROWS] = [0x9E37_79B9_7F4A_7C15, 0xC2B2_AE3D_27D4_EB4F, 0x1656_67B1_9E37_79F9, 0xD6E8_FEB8_6659_FD93];
        let mixed = (key.1 as u64) ^ ((key.1 >> 64) as u64).rotate_left(17) ^ ((key.0 as u64) << 48) ^ key.2 as u64;
        std::array::from_fn(|r| r * self.width + (mixed.wrapping_mul(MUL[r]) >> 40) as usize % self.width)
    }

    fn count(&self, key: &TierKey) -> u32 {
        self.cells(key).iter().map(|&c| self.rows[c] as u32).min().unwrap_or(0)
    }

    pub fn see(&mut self, key: &TierKey) {
        for c in self.cells(key) {
            self.rows[c] = self.rows[c].saturating_add(1);
        }
        self.observed += 1;
        if self.observed.is_multiple_of(self.cfg.half_life) {
            self.rows.iter_mut().for_each(|c| *c /= 2);
        }
    }

    /// Whether `key` was seen at least `min_seen` times.
    pub fn admits(&self, key: &TierKey) -> bool {
        self.count(key) >= self.cfg.min_seen
    }

    /// Forget every count.
    pub fn clear(&mut self) {
        self.rows.iter_mut().for_each(|c| *c = 0);
    }
}
