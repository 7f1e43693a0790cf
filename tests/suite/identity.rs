//! Face identity on real photos of real people (White House photographs of Barack Obama and Joe
//! Biden from face_recognition's test images, public domain, unpacked by scripts/test.sh into
//! samples/people/, and the set-up's portrait of Eileen Collins): the detector's points, dlib's
//! chip and the converted model put one person's photos closer than the usual 0.6 and two
//! people farther.

use std::path::{Path, PathBuf};

use gpen_video::api::faces::detect::Detector;
use gpen_video::api::faces::identity::{distance, Identifier};
use gpen_video::api::people::identity_of;
use gpen_video::api::runtime::{session, SessionOptions};

fn need(p: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(p);
    assert!(
        path.is_file(),
        "{p} is missing: run scripts/test.sh (or scripts/setup.sh) first"
    );
    path
}

#[test]
fn one_persons_photos_are_closer_than_two_peoples() {
    gpen_video::init_ffmpeg();
    let opts = SessionOptions::cpu(1);
    let det = session(&need("models/centerface.onnx"), &opts, "detector").unwrap();
    let mut detector = Detector::new(det, (640, 640), 0.5, 0.3, 0).unwrap();
    let mut id = Identifier::new(session(&need("models/face-id.onnx"), &opts, "face identity").unwrap()).unwrap();
    let photos = [
        "samples/people/obama.jpg",
        "samples/people/obama2.jpg",
        "samples/people/obama3.jpg",
        "samples/people/biden.jpg",
        "samples/astronaut.png",
    ];
    let who = [0, 0, 0, 1, 2];
    let d: Vec<_> = photos
        .iter()
        .map(|p| {
            gpen_video::api::people::reference(
                &need(p),
                &mut detector,
                &mut id,
                gpen_video::api::kernels::Cpu::detected(),
            )
            .unwrap()
            .descriptor
        })
        .collect();
    for i in 0..d.len() {
        for j in i + 1..d.len() {
            let dist = distance(&d[i], &d[j]);
            let id = identity_of(dist);
            eprintln!("{} {}: distance {dist:.3}, identity {id:.3}", photos[i], photos[j]);
            // The calibrated scale: one person at least 0.6, two people at most 0.5, with room.
            if who[i] == who[j] {
                assert!(dist < 0.5 && id >= 0.6, "{} and {}: {dist}, {id}", photos[i], photos[j]);
            } else {
                assert!(dist > 0.7 && id <= 0.5, "{} and {}: {dist}, {id}", photos[i], photos[j]);
            }
        }
    }
}

#[test]
fn a_photo_without_a_face_is_an_error_naming_it() {
    gpen_video::init_ffmpeg();
    let dir = tempfile::tempdir().unwrap();
    let blank = dir.path().join("wall.png");
    let status = std::process::Command::new("ffmpeg")
        .args([
            "-v",
            "error",
            "-f",
            "lavfi",
            "-i",
            "color=c=gray:s=320x240",
            "-frames:v",
            "1",
        ])
        .arg(&blank)
        .status()
        .unwrap();
    assert!(status.success());
    let opts = SessionOptions::cpu(1);
    let det = session(&need("models/centerface.onnx"), &opts, "detector").unwrap();
    let mut detector = Detector::new(det, (640, 640), 0.5, 0.3, 0).unwrap();
    let mut id = Identifier::new(session(&need("models/face-id.onnx"), &opts, "face identity").unwrap()).unwrap();
    let e = gpen_video::api::people::reference(
        &blank,
        &mut detector,
        &mut id,
        gpen_video::api::kernels::Cpu::detected(),
    )
    .err()
    .expect("an error");
    let words = format!("{e:#}");
    assert!(words.contains("wall.png") && words.contains("no face"), "{words}");
}
