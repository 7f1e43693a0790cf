//! A change in fixed point: in, a change of a picture in levels (f32); out, the same in 16-bit
//! steps of 1/128 level and back, the form a crop's change is kept and filtered in.

/// Steps of a level in which the model's change in a crop is kept ([`FaceJob::restored`], the
/// temporal filter's averages): 16-bit integers, 1/128 of a level each, so any change of a
/// picture in levels (-255..=255) fits in two bytes a value instead of a float's four. A value
/// is at most 1/256 of a level off the float one, and the paste rounds to whole levels.
pub(crate) const CHANGE_STEPS: f32 = 128.0;

/// A change in levels as steps ([`CHANGE_STEPS`]), rounded to the nearest (ties to even).
#[inline(always)]
pub fn change_steps(levels: f32) -> i16 {
    round_steps(levels * CHANGE_STEPS)
}

/// A value in steps rounded to the nearest whole step (ties to even) as `i16`, saturating (a
/// NaN gives no particular value: the worker refuses a change that is not finite first).
/// Added to 1.5 * 2^23, where a float's step is one, the value is rounded by the addition and
/// its integer sits in the float's low bits: integer work the compiler turns into vector code
/// (`round_ties_even` needs SSE4.1 or a library call, and a float's cast checks every lane).
#[inline(always)]
pub(crate) fn round_steps(steps: f32) -> i16 {
    round_steps_within(steps.clamp(-32768.0, 32767.0))
}

/// [`round_steps`] of a value already within the `i16` range (no clamp: what lies between two
/// `i16` values does, as an average's step `now + share * (history - now)` with a share in
/// [0, 1] does, each of its operations rounding towards the ends, never past them).
#[inline(always)]
pub(crate) fn round_steps_within(steps: f32) -> i16 {
    const ROUND: f32 = 12_582_912.0;
    ((steps + ROUND).to_bits() as i32 - ROUND.to_bits() as i32) as i16
}

/// A change in steps ([`CHANGE_STEPS`]) in levels.
#[inline(always)]
pub(crate) fn change_levels(steps: i16) -> f32 {
    f32::from(steps) * (1.0 / CHANGE_STEPS)
}

#[cfg(test)]
mod tests {
    use super::{change_levels, change_steps, round_steps, round_steps_within};

    /// An average's step between two `i16` values never leaves their range, so rounding it
    /// without the clamp gives what rounding with it gives: at the range's ends, across it,
    /// and at shares from 0 to the largest below 1.
    #[test]
    fn a_step_between_two_values_rounds_the_same_without_the_clamp() {
        let ends = [i16::MIN, i16::MIN + 1, -32640, -1, 0, 1, 32640, i16::MAX - 1, i16::MAX];
        let values = ends
            .into_iter()
            .chain((0..400).map(|k| (k * 7919 % 65536 - 32768) as i16));
        let values: Vec<i16> = values.collect();
        let shares = [0.0f32, 1e-7, 0.25, 0.5, 0.8, 0.999_999, 1.0 - f32::EPSILON / 2.0];
        for &n in &values {
            for &h in &values {
                for &share in &shares {
                    let nf = f32::from(n);
                    let v = nf + share * (f32::from(h) - nf);
                    let (a, b) = (round_steps(v), round_steps_within(v));
                    assert_eq!(a, b, "now {n}, history {h}, share {share}");
                    assert!(
                        (n.min(h)..=n.max(h)).contains(&a),
                        "now {n}, history {h}, share {share}"
                    );
                }
            }
        }
    }

    /// Rounding to steps is `round_ties_even` on every value in range (halves to the even
    /// step, negative ones too), and saturates beyond.
    #[test]
    fn steps_round_to_nearest_even_and_saturate() {
        for k in -400_000i32..400_000 {
            let v = k as f32 / 8.0;
            let want = v.round_ties_even().clamp(-32768.0, 32767.0) as i16;
            assert_eq!(round_steps(v), want, "{v}");
        }
        assert_eq!((round_steps(0.5), round_steps(1.5), round_steps(-2.5)), (0, 2, -2));
        assert_eq!((round_steps(1e9), round_steps(-1e9)), (i16::MAX, i16::MIN));
        assert_eq!(change_steps(255.0), 32640);
        assert_eq!(change_levels(change_steps(-17.25)), -17.25);
    }
}
