//! Token arithmetic of a paged sequence: token `t` lives in logical block
//! `t / block_size` at offset `t % block_size`; lengths are bounded for int32 exports.

use crate::error::Result;
use crate::invalid;

/// Longest sequence, in tokens: lengths are exported as int32.
pub const MAX_SEQ_TOKENS: usize = i32::MAX as usize;

/// `tokens % block_size`: the filled slots of the last block of a sequence of `tokens`
/// tokens (0 when it is full). Block sizes are almost always powers of two, and a mask
/// is far cheaper than the division a decode hot path would otherwise do per sequence.
#[inline]
pub fn offset_in_block(tokens: usize, block_size: usize) -> usize {
    if block_size.is_power_of_two() {
        tokens & (block_size - 1)
    } else {
        tokens % block_size
    }
}

/// `len + n` if a sequence of `len` tokens may grow by `n` (at most [`MAX_SEQ_TOKENS`]).
pub fn checked_len(len: usize, n: usize) -> Result<usize> {
    match len.checked_add(n) {
        Some(total) if total <= MAX_SEQ_TOKENS => Ok(total),
        _ => Err(invalid!(
            "num_tokens: a sequence of {len} tokens cannot grow by {n}: the limit is {MAX_SEQ_TOKENS} tokens"
        )),
    }
}

/// Blocks needed to hold `tokens` tokens: `ceil(tokens / block_size)`.
#[inline]
pub fn blocks_for(tokens: usize, block_size: usize) -> usize {
    tokens.div_ceil(block_size)
}
