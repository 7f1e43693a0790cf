//! Hands near faces on real photos: in, OpenCV's open palm (samples/hands/handSrc.jpg) cut out
//! of its plain background, turned fingers up and pasted over Eileen Collins' face
//! (samples/astronaut.png), and the project's face photos alone; out, the hands `Hands::find`
//! returns near the detected face (their points on the pasted hand, their region over its
//! pixels and little of the face besides), none on the photos without a hand, `HandTracker`
//! following the hand moved 20 pixels a frame without lag, and each model's CPU time per run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpen_video::api::faces::detect::Detector;
use gpen_video::api::faces::hands::{Hand, HandTracker, Hands, POINTS};
use gpen_video::api::kernels::Cpu;
use gpen_video::api::people::faces_in_photo;
use gpen_video::api::runtime::{session, SessionOptions};

use crate::common::{cutout, Cutout};

fn need(p: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(p);
    assert!(
        path.is_file(),
        "{p} is missing: run scripts/test.sh (or scripts/setup.sh) first"
    );
    path
}

fn detector() -> Detector {
    let det = session(&need("models/centerface.onnx"), &SessionOptions::cpu(1), "detector").unwrap();
    Detector::new(det, (640, 640), 0.5, 0.3, 0).unwrap()
}

/// Both hand models on one thread.
fn hands() -> Hands {
    Hands::open(
        &need("models/palm-detect.onnx"),
        &need("models/hand-landmarks.onnx"),
        &SessionOptions::cpu(1),
        Cpu::detected(),
    )
    .unwrap()
}

/// The photo (packed RGB, `w x h`) with the cut-out's hand pixels pasted with their top left
/// corner at `at`, and which frame pixels are the hand.
fn paste(photo: &[u8], (w, h): (usize, usize), c: &Cutout, at: (i64, i64)) -> (Vec<u8>, Vec<bool>) {
    let (mut rgb, mut hand) = (photo.to_vec(), vec![false; w * h]);
    for y in 0..c.h {
        for x in 0..c.w {
            let (fx, fy) = (at.0 + x as i64, at.1 + y as i64);
            if !c.hand[y * c.w + x] || fx < 0 || fy < 0 || fx >= w as i64 || fy >= h as i64 {
                continue;
            }
            let (i, j) = (fy as usize * w + fx as usize, y * c.w + x);
            rgb[3 * i..3 * i + 3].copy_from_slice(&c.rgb[3 * j..3 * j + 3]);
            hand[i] = true;
        }
    }
    (rgb, hand)
}

/// Collins' portrait and her face's box.
fn portrait() -> (Vec<u8>, (usize, usize), [f32; 4]) {
    let (rgb, w, h, faces) = faces_in_photo(&need("samples/astronaut.png"), &mut detector()).unwrap();
    assert_eq!(faces.len(), 1, "one face in the portrait");
    (rgb, (w, h), faces[0].bbox)
}

/// The cut-out's top left corner for a hand over the face's right half: the fingertips at the
/// forehead, the wrist at the neck.
fn over_face(b: [f32; 4]) -> (i64, i64) {
    (((b[0] + b[2]) / 2.0 - 40.0) as i64, (b[1] - 20.0) as i64)
}

const HAND_HEIGHT: u32 = 192;

#[test]
fn a_hand_over_the_face_is_found_and_its_region_covers_it() {
    gpen_video::init_ffmpeg();
    let (photo, (w, h), face) = portrait();
    let c = cutout(HAND_HEIGHT);
    let at = over_face(face);
    let (frame, truth) = paste(&photo, (w, h), &c, at);
    let mut model = hands();
    let found = model.find(&frame, (w, h), face).unwrap();
    assert_eq!(found.len(), 1, "one hand over the face {face:?}: {found:?}");
    let hand = found[0];
    assert!(hand.presence > 0.9, "presence {}", hand.presence);
    // The wrist and the five fingertips on the pasted hand: inside its box (the wrist, cut by
    // the photo's edge, may lie a little below it).
    let (x0, y0) = (at.0 as f32, at.1 as f32);
    let (x1, y1) = (x0 + c.w as f32, y0 + c.h as f32);
    for i in [0, 4, 8, 12, 16, 20] {
        let [x, y] = hand.points[i];
        assert!(
            x >= x0 - 5.0 && x <= x1 + 5.0 && y >= y0 - 5.0 && y <= y1 + 15.0,
            "point {i} at ({x:.0}, {y:.0}), the hand in ({x0}, {y0})-({x1}, {y1})"
        );
    }
    // The fingertips are above the knuckles: the hand is upright.
    assert!(hand.points[12][1] < hand.points[9][1] - 30.0);
    // Inside the face's box: the share of the hand's pixels the region covers, and the share
    // of the face's other pixels it covers.
    let (mut hand_px, mut hand_in, mut face_px, mut face_in) = (0, 0, 0, 0);
    let [fx0, fy0, fx1, fy1] = face.map(|v| v.round() as usize);
    for y in fy0..fy1.min(h) {
        for x in fx0..fx1.min(w) {
            let covered = hand.coverage(x as f32, y as f32) >= 0.5;
            if truth[y * w + x] {
                hand_px += 1;
                hand_in += usize::from(covered);
            } else {
                face_px += 1;
                face_in += usize::from(covered);
            }
        }
    }
    let (hand_share, face_share) = (hand_in as f64 / hand_px as f64, face_in as f64 / face_px as f64);
    eprintln!(
        "face {face:?}: the hand's {hand_px} pixels in it {:.1} % covered, the face's other {face_px} pixels {:.1} % covered; hand size {:.1}, radius {:.1}",
        100.0 * hand_share,
        100.0 * face_share,
        hand.size(),
        hand.radius()
    );
    assert!(hand_px > 2000, "the hand covers {hand_px} pixels of the face");
    assert!(hand_share >= 0.9, "{:.1} % of the hand covered", 100.0 * hand_share);
    assert!(
        face_share <= 0.15,
        "{:.1} % of the face outside the hand covered",
        100.0 * face_share
    );
}

#[test]
fn faces_without_hands_have_none() {
    gpen_video::init_ffmpeg();
    let mut det = detector();
    let mut model = hands();
    let mut faces_seen = 0;
    for p in [
        "samples/astronaut.png",
        "samples/people/obama.jpg",
        "samples/people/obama2.jpg",
        "samples/people/obama3.jpg",
        "samples/people/biden.jpg",
    ] {
        let (rgb, w, h, faces) = faces_in_photo(&need(p), &mut det).unwrap();
        for f in &faces {
            let palms = model.palms(&rgb, (w, h), f.bbox).unwrap();
            let found = model.find(&rgb, (w, h), f.bbox).unwrap();
            eprintln!("{p}: face {:?}, {} palms, {} hands", f.bbox, palms.len(), found.len());
            assert!(found.is_empty(), "{p}: a hand near the face {:?}: {found:?}", f.bbox);
        }
        faces_seen += faces.len();
    }
    assert!(faces_seen >= 5, "{faces_seen} faces");
}

#[test]
fn the_tracker_follows_a_moving_hand_without_lag() {
    gpen_video::init_ffmpeg();
    let (photo, (w, h), face) = portrait();
    let c = cutout(HAND_HEIGHT);
    let start = over_face(face);
    let mut model = hands();
    let mut tracker = HandTracker::new(5);
    let mut first: Option<Hand> = None;
    for k in 0..10 {
        let at = (start.0 - 120 + 20 * k, start.1);
        let (frame, _) = paste(&photo, (w, h), &c, at);
        let hands = tracker.next(&mut model, &frame, (w, h), face, k as u64).unwrap();
        assert_eq!(hands.len(), 1, "frame {k}: {hands:?}");
        let hand = hands[0];
        let first = *first.get_or_insert(hand);
        // Each point's offset from the first frame's against the hand's.
        let off: Vec<[f32; 2]> = hand
            .points
            .iter()
            .zip(&first.points)
            .map(|(p, q)| [p[0] - q[0] - 20.0 * k as f32, p[1] - q[1]])
            .collect();
        let errors: Vec<f32> = off.iter().map(|d| d[0].hypot(d[1])).collect();
        let mean = errors.iter().sum::<f32>() / errors.len() as f32;
        // The fingers' points (2 to 20); the wrist and the thumb's root lie where the photo
        // cuts the hand off, so each crop places them a little differently.
        let fingers = errors[2..].iter().copied().fold(0.0, f32::max);
        let base = errors[0].max(errors[1]);
        // Lag would put the points behind the hand (a negative x offset) by the same amount.
        let behind = -off[2..].iter().map(|d| d[0]).sum::<f32>() / (POINTS - 2) as f32;
        eprintln!(
            "frame {k}: moved {}; off by {mean:.2} on average, the fingers' points {fingers:.2} at most and {behind:.2} behind on average, the wrist and thumb root {base:.2} at most",
            20 * k
        );
        assert!(mean < 4.0, "frame {k}: points {mean:.2} pixels off on average");
        assert!(fingers < 6.0, "frame {k}: a finger's point {fingers:.2} pixels off");
        assert!(
            behind.abs() < 2.0,
            "frame {k}: the fingers {behind:.2} pixels behind the hand"
        );
        assert!(base < 20.0, "frame {k}: the wrist or thumb root {base:.2} pixels off");
    }
    // Palm detection on frames 0 and 5 only; the landmarks every frame.
    let cpu = model.model_cpu();
    assert_eq!((cpu.palm_runs, cpu.landmark_runs), (2, 10));
}

#[test]
fn each_model_runs_in_a_few_milliseconds() {
    gpen_video::init_ffmpeg();
    let (photo, (w, h), face) = portrait();
    let (frame, _) = paste(&photo, (w, h), &cutout(HAND_HEIGHT), over_face(face));
    let mut model = hands();
    let roi = model.palms(&frame, (w, h), face).unwrap()[0].roi();
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e3
    };
    let (mut palm, mut marks, mut palm_wall, mut marks_wall) = (vec![], vec![], vec![], vec![]);
    for _ in 0..15 {
        let (before, t) = (model.model_cpu(), Instant::now());
        model.palms(&frame, (w, h), face).unwrap();
        palm_wall.push(t.elapsed());
        palm.push(model.model_cpu().palm - before.palm);
        let (before, t) = (model.model_cpu(), Instant::now());
        model.landmarks(&frame, (w, h), &[roi]).unwrap();
        marks_wall.push(t.elapsed());
        marks.push(model.model_cpu().landmarks - before.landmarks);
    }
    let (p, m) = (median(palm), median(marks));
    eprintln!(
        "one thread, median of 15: palm detection {p:.2} core-ms in the model ({:.2} ms the whole call), hand landmarks {m:.2} core-ms ({:.2} ms the whole call)",
        median(palm_wall),
        median(marks_wall)
    );
    // Generous bounds (a shared machine): each well under a tenth of a second.
    assert!(p > 0.0 && p < 100.0 && m > 0.0 && m < 100.0);
}

#[test]
fn bad_models_and_frames_are_errors_that_say_what_to_do() {
    gpen_video::init_ffmpeg();
    let mesh = need("models/face-mesh.onnx");
    let err = Hands::open(
        &mesh,
        &need("models/hand-landmarks.onnx"),
        &SessionOptions::cpu(1),
        Cpu::detected(),
    )
    .err()
    .expect("the face mesh is no palm detector");
    let text = format!("{err:#}");
    assert!(
        text.contains("face-mesh.onnx") && text.contains("scripts/setup.sh"),
        "{text}"
    );
    let err = Hands::open(
        Path::new("no-such-palm.onnx"),
        &need("models/hand-landmarks.onnx"),
        &SessionOptions::cpu(1),
        Cpu::detected(),
    )
    .err()
    .expect("a missing file");
    assert!(format!("{err:#}").contains("no-such-palm.onnx"), "{err:#}");
    let mut model = hands();
    let err = model.find(&[0u8; 10], (64, 64), [10.0, 10.0, 30.0, 30.0]).unwrap_err();
    assert!(format!("{err:#}").contains("64x64"), "{err:#}");
    // A face box off the frame or not finite has no neighbourhood: no hands, no error.
    let frame = vec![128u8; 64 * 64 * 3];
    assert!(model
        .find(&frame, (64, 64), [f32::NAN, 0.0, 1.0, 1.0])
        .unwrap()
        .is_empty());
    assert!(model
        .find(&frame, (64, 64), [500.0, 500.0, 600.0, 600.0])
        .unwrap()
        .is_empty());
}
