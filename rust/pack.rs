//! Packing: many samples flattened into one batch for variable-length attention.
//!
//! FlashAttention's varlen kernels take the concatenated tokens and `cu_seqlens`, the int32
//! offsets where each sequence starts; position ids restart at 0 for every sample so rotary
//! embeddings see each one as if it were alone. Loss mask and logprobs are spread over the full
//! packed length: 0 on prompt positions, the sample's own values on its response.
use std::iter::repeat_n;

use crate::error::Error;

/// Samples flattened into one batch. Per-token arrays have one entry per packed token; per-sample
/// arrays have one entry per sample.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Packed {
    /// Every sample's tokens, one after another.
    pub tokens: Vec<u32>,
    /// Where each sample starts, then the total: `samples + 1` entries from 0.
    pub cu_seqlens: Vec<i32>,
    /// Each token's position inside its own sample.
    pub position_ids: Vec<i32>,
    /// Each token's sample.
    pub sample_index: Vec<i32>,
    /// 0 on prompt positions, the sample's loss mask on its response.
    pub loss_mask: Vec<u8>,
    /// 0 on prompt positions, the sample's rollout logprobs on its response.
    pub logprobs: Vec<f32>,
    /// One reward per sample.
    pub rewards: Vec<f32>,
    /// One zero per sample: a slot the trainer fills.
    pub advantages: Vec<f32>,
    /// The longest sample's length, FlashAttention's `max_seqlen`.
    pub max_seqlen: usize,
}

/// Pack samples given as parallel slices: sample `i` is `tokens[i]` (prompt and response), whose
/// last `response_lengths[i]` tokens carry `loss_masks[i]` and `logprobs[i]`, and `rewards[i]`.
///
/// Everything is checked before anything is copied, in this order: each per-sample input has
/// one entry per token array; then, sample by sample, the response length lies in
/// `0..=tokens.len()` and the loss mask and logprobs have one entry per response token; then
/// the packed length and the sample count fit in `i32`.
pub fn pack(
    tokens: &[&[u32]],
    loss_masks: &[&[u8]],
    logprobs: &[&[f32]],
    response_lengths: &[i64],
    rewards: &[f32],
) -> Result<Packed, Error> {
    let samples = tokens.len();
    let counts = [
        ("loss_masks", loss_masks.len()),
        ("logprobs", logprobs.len()),
        ("response_lengths", response_lengths.len()),
        ("rewards", rewards.len()),
    ];
    for (what, got) in counts {
        if got != samples {
            return Err(Error::PackCount { what, got, samples });
        }
    }
    let prompts = tokens
        .iter()
        .zip(loss_masks)
        .zip(logprobs)
        .zip(response_lengths)
        .enumerate()
        .map(|(sample, (((ids, mask), lps), &response_length))| {
            let response = usize::try_from(response_length)
                .ok()
                .filter(|&response| response <= ids.len())
                .ok_or(Error::ResponseLength {
                    sample,
                    response_length,
                    tokens: ids.len(),
                })?;
            fits_response(sample, "loss_mask", mask.len(), response)?;
            fits_response(sample, "logprobs", lps.len(), response)?;
            Ok(ids.len() - response)
        })
        .collect::<Result<Vec<usize>, Error>>()?;
    let cu_seqlens = cu_seqlens(tokens.iter().map(|ids| ids.len()))?;
    let total = cu_seqlens.last().map_or(0, |&end| end as usize);

    let mut packed = Packed {
        tokens: Vec::with_capacity(total),
        cu_seqlens,
        position_ids: Vec::with_capacity(total),
        sample_index: Vec::with_capacity(total),
        loss_mask: Vec::with_capacity(total),
        logprobs: Vec::with_capacity(total),
        rewards: rewards.to_vec(),
        advantages: vec![0.0; samples],
        max_seqlen: tokens.iter().map(|ids| ids.len()).max().unwrap_or(0),
    };
    for (sample, (((ids, mask), lps), prompt)) in tokens
        .iter()
        .zip(loss_masks)
        .zip(logprobs)
        .zip(prompts)
        .enumerate()
    {
        // `cu_seqlens` has refused packed lengths and sample counts beyond `i32::MAX`.
        let (len, sample) = (ids.len() as i32, sample as i32);
        packed.tokens.extend_from_slice(ids);
        packed.position_ids.extend(0..len);
        packed.sample_index.extend(repeat_n(sample, ids.len()));
        packed.loss_mask.extend(repeat_n(0, prompt));
        packed.loss_mask.extend_from_slice(mask);
        packed.logprobs.extend(repeat_n(0.0, prompt));
        packed.logprobs.extend_from_slice(lps);
    }
    Ok(packed)
}

/// Every sample's replay rows (`what`: routed experts or indexer top-k), one after another:
/// sample `i` holds `row` values per token, `tokens[i]` tokens. Refused, before anything is
/// copied: another number of samples than `tokens` has (`Error::PackCount`), then the first
/// sample with another number of rows than tokens (`Error::PackRows`).
pub fn pack_rows<T: Copy>(
    what: &'static str,
    rows: &[&[T]],
    row: usize,
    tokens: &[usize],
) -> Result<Vec<T>, Error> {
    if rows.len() != tokens.len() {
        return Err(Error::PackCount {
            what,
            got: rows.len(),
            samples: tokens.len(),
        });
    }
    for (sample, (values, &tokens)) in rows.iter().zip(tokens).enumerate() {
        let rows = values.len().checked_div(row).unwrap_or(0);
        if rows != tokens || values.len() != rows * row {
            return Err(Error::PackRows {
                sample,
                what,
                rows,
                tokens,
            });
        }
    }
    Ok(rows.concat())
}

/// `Error::PackLength` unless `got`, the length of the sample's `what`, is `response`.
fn fits_response(
    sample: usize,
    what: &'static str,
    got: usize,
    response: usize,
) -> Result<(), Error> {
    if got == response {
        return Ok(());
    }
    Err(Error::PackLength {
        sample,
        what,
        got,
        response_length: response,
    })
}

/// FlashAttention's `cu_seqlens` for sequences of these lengths: 0, then the running totals.
/// `Error::PackTooLong` when the total or the number of sequences does not fit in `i32`.
fn cu_seqlens(lengths: impl Iterator<Item = usize> + Clone) -> Result<Vec<i32>, Error> {
    let (samples, tokens) = lengths.clone().fold((0usize, 0usize), |(n, total), len| {
        (n + 1, total.saturating_add(len))
    });
    if i32::try_from(tokens).is_err() || i32::try_from(samples).is_err() {
        return Err(Error::PackTooLong { tokens, samples });
    }
    let mut out = Vec::with_capacity(samples + 1);
    out.push(0);
    // Every running total is at most `tokens`, which fits.
    out.extend(lengths.scan(0, |end, len| {
        *end += len as i32;
        Some(*end)
    }));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Named tokens: a system prompt S, user turns U1 U2, answers A1 A2 and B1.
    const S: u32 = 100;
    const U1: u32 = 201;
    const U2: u32 = 202;
    const A1: u32 = 301;
    const A2: u32 = 302;
    const B1: u32 = 311;

    fn two_samples() -> Packed {
        pack(
            &[&[S, U1, A1, A2], &[U2, B1]],
            &[&[1, 0], &[1]],
            &[&[-0.5, -1.5], &[-2.0]],
            &[2, 1],
            &[1.0, -0.25],
        )
        .unwrap()
    }

    #[test]
    fn samples_lie_one_after_another_with_flash_attention_offsets() {
        let packed = two_samples();
        assert_eq!(packed.tokens, [S, U1, A1, A2, U2, B1]);
        assert_eq!(packed.cu_seqlens, [0, 4, 6]);
        assert_eq!(packed.max_seqlen, 4);
    }

    #[test]
    fn positions_restart_and_tokens_know_their_sample() {
        let packed = two_samples();
        assert_eq!(packed.position_ids, [0, 1, 2, 3, 0, 1]);
        assert_eq!(packed.sample_index, [0, 0, 0, 0, 1, 1]);
    }

    #[test]
    fn mask_and_logprobs_cover_the_response_and_zero_the_prompt() {
        let packed = two_samples();
        assert_eq!(packed.loss_mask, [0, 0, 1, 0, 0, 1]);
        assert_eq!(packed.logprobs, [0.0, 0.0, -0.5, -1.5, 0.0, -2.0]);
    }

    #[test]
    fn rewards_per_sample_and_advantages_left_zero() {
        let packed = two_samples();
        assert_eq!(packed.rewards, [1.0, -0.25]);
        assert_eq!(packed.advantages, [0.0, 0.0]);
    }

    #[test]
    fn nothing_packs_to_one_offset() {
        let packed = pack(&[], &[], &[], &[], &[]).unwrap();
        assert_eq!(packed.cu_seqlens, [0]);
        assert_eq!(packed.max_seqlen, 0);
        assert!(packed.tokens.is_empty() && packed.rewards.is_empty());
    }

    #[test]
    fn empty_responses_and_empty_samples_pack() {
        let packed = pack(
            &[&[S, U1], &[], &[A1]],
            &[&[], &[], &[1]],
            &[&[], &[], &[-1.0]],
            &[0, 0, 1],
            &[0.0; 3],
        )
        .unwrap();
        assert_eq!(packed.cu_seqlens, [0, 2, 2, 3]);
        assert_eq!(packed.position_ids, [0, 1, 0]);
        assert_eq!(packed.sample_index, [0, 0, 2]);
        assert_eq!(packed.loss_mask, [0, 0, 1]);
    }

    #[test]
    fn per_sample_inputs_must_match_the_token_arrays_in_number() {
        let err = pack(&[&[S]], &[&[], &[]], &[&[]], &[0], &[0.0]).unwrap_err();
        assert_eq!(
            err,
            Error::PackCount {
                what: "loss_masks",
                got: 2,
                samples: 1
            }
        );
        let err = pack(&[&[S]], &[&[]], &[&[]], &[0], &[]).unwrap_err();
        assert_eq!(err.to_string(), "rewards: 0 entries for 1 samples");
    }

    #[test]
    fn response_length_must_lie_within_the_tokens() {
        for response_length in [-1, 3] {
            let err = pack(
                &[&[S, A1]],
                &[&[1, 1]],
                &[&[0.0; 2]],
                &[response_length],
                &[0.0],
            );
            assert_eq!(
                err.unwrap_err(),
                Error::ResponseLength {
                    sample: 0,
                    response_length,
                    tokens: 2
                }
            );
        }
    }

    #[test]
    fn mask_then_logprobs_must_fit_the_response() {
        let err = pack(
            &[&[S], &[S, A1, A2]],
            &[&[], &[1]],
            &[&[], &[-1.0]],
            &[0, 2],
            &[0.0; 2],
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "sample 1: 1 loss_mask entries for response_length 2"
        );
        let err = pack(&[&[S, A1]], &[&[1]], &[&[]], &[1], &[0.0]).unwrap_err();
        assert_eq!(
            err,
            Error::PackLength {
                sample: 0,
                what: "logprobs",
                got: 0,
                response_length: 1
            }
        );
    }

    #[test]
    fn replay_rows_lie_one_after_another_one_row_per_token() {
        let rows = pack_rows(
            "routed_experts",
            &[&[1u8, 2, 3, 4], &[], &[5, 6]],
            2,
            &[2, 0, 1],
        );
        assert_eq!(rows, Ok(vec![1, 2, 3, 4, 5, 6]));
        let err = pack_rows("routed_experts", &[&[1u8, 2], &[]], 2, &[1, 1]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "sample 1: 0 routed_experts rows for 1 tokens"
        );
        let err = pack_rows::<i32>("indexer_topk", &[], 3, &[4]).unwrap_err();
        assert_eq!(err.to_string(), "indexer_topk: 0 entries for 1 samples");
    }

    #[test]
    fn offsets_stop_at_i32() {
        let max = i32::MAX as usize;
        assert_eq!(cu_seqlens([max].into_iter()), Ok(vec![0, i32::MAX]));
        let err = cu_seqlens([max, 1].into_iter()).unwrap_err();
        assert_eq!(
            err,
            Error::PackTooLong {
                tokens: max + 1,
                samples: 2
            }
        );
        let err = cu_seqlens([usize::MAX, 1].into_iter()).unwrap_err();
        assert_eq!(
            err,
            Error::PackTooLong {
                tokens: usize::MAX,
                samples: 2
            }
        );
    }
}
