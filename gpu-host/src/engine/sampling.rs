//! Token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty,
//! all driven by a seeded generator so the same seed gives the same output.

/// How to pick the next token. The defaults are greedy decoding.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy: always the most likely token.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0 = no limit).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1.0 = all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0 = off).
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of recently seen tokens by this (1.0 = off).
    pub repetition_penalty: f32,
    /// How many of the most recent tokens the repetition penalty looks at.
    pub repetition_window: usize,
    /// Seed of the random generator.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            repetition_window: 64,
            seed: 0,
        }
    }
}

/// Why sampling parameters were refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SamplingError {
    #[error("{name} must be {rule}, got {value}")]
    OutOfRange {
        name: &'static str,
        rule: &'static str,
        value: f32,
    },
}

impl SamplingParams {
    /// Checks every field's range.
    pub fn validate(&self) -> Result<(), SamplingError> {
        let check = |name, ok: bool, rule, value| {
            if ok {
                Ok(())
            } else {
                Err(SamplingError::OutOfRange { name, rule, value })
            }
        };
        let t = self.temperature;
        check(
            "temperature",
            t.is_finite() && (0.0..=100.0).contains(&t),
            "in 0..=100",
            t,
        )?;
        let p = self.top_p;
        check(
            "top_p",
            p.is_finite() && p > 0.0 && p <= 1.0,
            "in (0, 1]",
            p,
        )?;
        let m = self.min_p;
        check(
            "min_p",
            m.is_finite() && (0.0..=1.0).contains(&m),
            "in 0..=1",
            m,
        )?;
        let r = self.repetition_penalty;
        check(
            "repetition_penalty",
            r.is_finite() && r > 0.0 && r <= 10.0,
            "in (0, 10]",
            r,
        )?;
        Ok(())
    }
}

/// A seeded sampler. Keeps its scratch buffer between calls.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: SplitMix64,
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler for validated `params`.
    pub fn new(params: SamplingParams) -> Result<Sampler, SamplingError> {
        params.validate()?;
        let rng = SplitMix64(params.seed);
        Ok(Sampler {
            params,
            rng,
            candidates: Vec::new(),
        })
    }

    /// Picks the next token from `logits` given the tokens so far (`history`).
    /// `logits` is modified (repetition penalty applied in place).
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            let start = history.len().saturating_sub(p.repetition_window);
            let mut seen: Vec<u32> = history[start..].to_vec();
            seen.sort_unstable();
            seen.dedup();
            for id in seen {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.temperature <= 0.0 {
            return argmax(logits);
        }

        let c = &mut self.candidates;
        c.clear();
        c.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        // Most likely first; ties broken by lower id so the order is total.
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < c.len() {
            c.select_nth_unstable_by(p.top_k - 1, by_logit);
            c.truncate(p.top_k);
        }
        // Only top_p keeps a prefix of the candidates by likelihood; the
        // softmax, min_p and the draw work in any order. Sorting a whole
        // vocabulary per token was a fifth of a single stream's decode time
        // on the demo model, for the OpenAI default top_p = 1.
        if p.top_p < 1.0 {
            c.sort_unstable_by(by_logit);
        }

        // Softmax at temperature.
        let max = c
            .iter()
            .map(|cand| cand.1)
            .max_by(f32::total_cmp)
            .unwrap_or(f32::NEG_INFINITY);
        let mut sum = 0.0f64;
        for cand in c.iter_mut() {
            cand.1 = ((cand.1 - max) / p.temperature).exp();
            sum += cand.1 as f64;
        }
        for cand in c.iter_mut() {
            cand.1 = (cand.1 as f64 / sum) as f32;
        }
        if p.min_p > 0.0 {
            let top = c.iter().map(|x| x.1).fold(0.0f32, f32::max);
            let floor = top * p.min_p;
            c.retain(|x| x.1 >= floor);
        }
        if c.is_empty() {
            // Only non-finite logits get here (every probability NaN).
            return argmax(logits);
        }
        if p.top_p < 1.0 {
            let mut acc = 0.0f32;
            let mut keep = c.len();
            for (i, cand) in c.iter().enumerate() {
                acc += cand.1;
                if acc >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep);
        }
        let total: f32 = c.iter().map(|x| x.1).sum();
        let mut r = self.rng.next_f32() * total;
        for cand in c.iter() {
            r -= cand.1;
            if r < 0.0 {
                return cand.0;
            }
        }
        c[c.len() - 1].0
    }
}

/// Index of the largest logit (the first one on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// SplitMix64: tiny, fast and good enough for sampling; fully determined by the seed.
#[derive(Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn greedy_picks_argmax_and_first_on_ties() {
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        assert_eq!(s.sample(&mut [0.1, 3.0, -1.0, 3.0], &[]), 1);
    }

    #[test]
    fn same_seed_same_tokens_other_seed_differs() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let run = |seed| {
            let mut s = Sampler::new(SamplingParams {
                seed,
                ..params(1.0)
            })
            .unwrap();
            (0..64)
                .map(|_| s.sample(&mut logits.clone(), &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_one_is_greedy_and_top_k_limits_support() {
        let logits = [0.0, 1.0, 2.0, 0.5, 1.9];
        let mut s = Sampler::new(SamplingParams {
            top_k: 1,
            ..params(5.0)
        })
        .unwrap();
        for _ in 0..20 {
            assert_eq!(s.sample(&mut logits.clone(), &[]), 2);
        }
        let mut s = Sampler::new(SamplingParams {
            top_k: 2,
            ..params(5.0)
        })
        .unwrap();
        for _ in 0..200 {
            assert!([2, 4].contains(&s.sample(&mut logits.clone(), &[])));
        }
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        // Probabilities ~ [0.665, 0.245, 0.09]: top_p 0.6 keeps only the first.
        let logits = [2.0f32, 1.0, 0.0];
        let mut s = Sampler::new(SamplingParams {
            top_p: 0.6,
            ..params(1.0)
        })
        .unwrap();
        for _ in 0..100 {
            assert_eq!(s.sample(&mut logits.clone(), &[]), 0);
        }
        let mut s = Sampler::new(SamplingParams {
            min_p: 0.3,
            ..params(1.0)
        })
        .unwrap();
        for _ in 0..200 {
            assert_ne!(s.sample(&mut logits.clone(), &[]), 2);
        }
    }

    #[test]
    fn sampling_frequencies_follow_the_distribution() {
        let logits = [0.0f32, (3.0f32).ln()]; // p = [0.25, 0.75]
        let mut s = Sampler::new(SamplingParams {
            seed: 1,
            ..params(1.0)
        })
        .unwrap();
        let n = 20_000;
        let ones = (0..n)
            .filter(|_| s.sample(&mut logits.clone(), &[]) == 1)
            .count();
        let freq = ones as f64 / n as f64;
        assert!((freq - 0.75).abs() < 0.02, "{freq}");
    }

    /// Draws `n` tokens and returns each token's frequency.
    fn frequencies(params: SamplingParams, logits: &[f32], n: usize) -> Vec<f64> {
        let mut s = Sampler::new(params).unwrap();
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..n {
            counts[s.sample(&mut logits.to_vec(), &[]) as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / n as f64).collect()
    }

    #[test]
    fn frequencies_follow_the_kept_distribution_with_and_without_cuts() {
        // Probabilities 0.1, 0.4, 0.2, 0.3 (logits are their logs), in an
        // order that is neither sorted nor reversed.
        let probs = [0.1f64, 0.4, 0.2, 0.3];
        let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
        let n = 40_000;
        let close = |got: &[f64], want: &[f64]| {
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 0.015, "got {got:?}, want {want:?}");
            }
        };
        let seed = |seed| SamplingParams {
            seed,
            ..params(1.0)
        };
        close(&frequencies(seed(3), &logits, n), &probs);
        // Each cut below keeps only 0.4 and 0.3, renormalised.
        let kept = [0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7];
        // top_k 2: the two most likely.
        let top_k = SamplingParams {
            top_k: 2,
            ..seed(4)
        };
        close(&frequencies(top_k, &logits, n), &kept);
        // min_p 0.6 keeps what is at least 0.24: 0.4 and 0.3.
        let min_p = SamplingParams {
            min_p: 0.6,
            ..seed(5)
        };
        close(&frequencies(min_p, &logits, n), &kept);
        // top_p 0.65 keeps the most likely until they reach it: 0.4 + 0.3.
        let top_p = SamplingParams {
            top_p: 0.65,
            ..seed(6)
        };
        close(&frequencies(top_p, &logits, n), &kept);
    }

    #[test]
    fn non_finite_logits_still_give_a_token() {
        let mut s = Sampler::new(params(1.0)).unwrap();
        let token = s.sample(&mut [f32::NAN, f32::NAN, f32::NAN], &[]);
        assert!(token < 3);
        let mut s = Sampler::new(SamplingParams {
            min_p: 0.5,
            ..params(1.0)
        })
        .unwrap();
        assert!(s.sample(&mut [f32::NAN, 1.0, f32::INFINITY], &[]) < 3);
    }

    #[test]
    fn repetition_penalty_discourages_seen_tokens() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(p).unwrap();
        assert_eq!(s.sample(&mut [1.0, 1.5, -1.0], &[1]), 0);
        let mut logits = [1.0, 1.5, -1.0];
        s.sample(&mut logits, &[2]);
        assert_eq!(logits[2], -2.0);
    }

    #[test]
    fn out_of_range_parameters_are_named() {
        for (p, name) in [
            (params(-1.0), "temperature"),
            (params(f32::NAN), "temperature"),
            (
                SamplingParams {
                    top_p: 0.0,
                    ..params(1.0)
                },
                "top_p",
            ),
            (
                SamplingParams {
                    min_p: 2.0,
                    ..params(1.0)
                },
                "min_p",
            ),
            (
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..params(1.0)
                },
                "repetition_penalty",
            ),
        ] {
            let err = Sampler::new(p).unwrap_err().to_string();
            assert!(err.contains(name), "{err}");
        }
    }
}
