#!/usr/bin/env python3
"""The service's page in a real browser: Debian's chromium, headless, driven by Playwright.

Starts `gpen-video serve` on a loopback port (a jobs folder of its own), opens the page, chooses
a photo and a short clip at once, waits until both items are `done`, downloads both through
their links, and checks: the photo's bytes equal `gpen-video IN OUT`'s for the same flags, the
clip decodes with the source's frame count, Tab alone reaches the file chooser and a download
link, the browser's console saw no error. Saves
screenshots (desktop and phone widths) into --shots.

    scripts/browser-test.py [--bin target/release/gpen-video] [--shots out/browser]

Needs `chromium` (apt) and `playwright` (pip) in the set-up's venv: scripts/browser-test.sh
installs both and runs this.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from playwright.sync_api import sync_playwright

import serve_child

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ffmpeg(*args):
    subprocess.run(["ffmpeg", "-v", "error", "-y", *args], check=True)


def frames(path):
    out = subprocess.run(
        ["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
         "stream=nb_read_frames", "-of", "csv=p=0", path],
        check=True, capture_output=True, text=True).stdout
    return int(out.strip())


def until(ok, seconds, what):
    end = time.time() + seconds
    while not ok():
        if time.time() > end:
            sys.exit(f"browser-test: FAILED: not {what} within {seconds} s")
        time.sleep(0.2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/gpen-video"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/standin/identity-256.onnx"))
    ap.add_argument("--browser", default=shutil.which("chromium") or "/usr/bin/chromium")
    ap.add_argument("--shots", default=os.path.join(ROOT, "out/browser"))
    a = ap.parse_args()
    os.makedirs(a.shots, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("ORT_DYLIB_PATH", os.path.join(ROOT, ".deps/lib/libonnxruntime.so"))
    work = tempfile.mkdtemp(prefix="gpen-browser-")
    server = None
    try:
        photo, clip = os.path.join(work, "portrait.jpg"), os.path.join(work, "clip.mp4")
        portrait = os.path.join(ROOT, "samples/astronaut.png")
        ffmpeg("-i", portrait, "-vf", "scale=384:384", "-q:v", "3", photo)
        ffmpeg("-loop", "1", "-i", portrait, "-vf",
               "scale=640:640,crop=480:360:x='80+40*sin(t)':y=60,format=yuv420p", "-r", "25",
               "-t", "2", "-c:v", "libx264", "-preset", "ultrafast", clip)
        want_photo = os.path.join(work, "cli.jpg")
        subprocess.run([a.bin, photo, want_photo, "--model", a.model, "-q"], check=True, env=env,
                       capture_output=True)
        # A user's CodeFormer (the stand-in of its contract), recorded by name: the page offers it
        # with its fidelity slider, and a job sent at fidelity 0 equals the CLI's at 0.
        env["XDG_CONFIG_HOME"] = os.path.join(work, "config")
        env["XDG_DATA_HOME"] = os.path.join(work, "data")
        subprocess.run([a.bin, "models", "add", os.path.join(ROOT, "models/standin/codeformer-512.onnx"),
                        "--name", "codeformer"], check=True, env=env, capture_output=True)
        want_faithful = os.path.join(work, "cli-faithful.jpg")
        subprocess.run([a.bin, photo, want_faithful, "--model", "codeformer", "--fidelity", "0", "-q"],
                       check=True, env=env, capture_output=True)

        env["XDG_STATE_HOME"] = os.path.join(work, "state")
        server, base = serve_child.start(
            a.bin, ["--model", a.model, "--jobs-dir", os.path.join(work, "jobs")], env, "browser-test")
        url = base + "/"

        problems = []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=a.browser, args=["--no-sandbox"])
            ctx = browser.new_context(viewport={"width": 1100, "height": 900}, accept_downloads=True)
            page = ctx.new_page()
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.goto(url)
            page.wait_for_selector("#mask option", state="attached")
            page.set_input_files("input[type=file]", [photo, clip])
            # Polled through locators (the page's Content-Security-Policy allows no eval, which
            # wait_for_function would need).
            finished = ".item[data-state=done], .item[data-state=failed]"
            until(lambda: page.locator(finished).count() == 2, 240, "both items done")
            failed = page.locator(".item[data-state=failed]")
            if failed.count():
                sys.exit("browser-test: FAILED: " + " | ".join(failed.all_inner_texts()))
            # Each result's link comes after its comparison is drawn.
            until(lambda: page.locator(".item a[download]").count() == 2, 60, "both download links")
            # By keyboard alone: Tab from the top reaches the file chooser first, then (past the
            # controls and each result's slider) a download link.
            page.locator("body").click(position={"x": 5, "y": 5})
            page.keyboard.press("Tab")
            if page.locator("#file:focus").count() != 1:
                problems.append("Tab from the top does not reach the file chooser first")
            for _ in range(40):
                if page.locator("a[download]:focus").count():
                    break
                page.keyboard.press("Tab")
            else:
                problems.append("Tab never reaches a download link")
            got = {}
            for item in page.locator(".item").all():
                name = item.locator(".name").inner_text()
                with page.expect_download() as d:
                    item.locator("a[download]").click()
                path = os.path.join(work, "got-" + d.value.suggested_filename)
                d.value.save_as(path)
                got[name] = path
            page.screenshot(path=os.path.join(a.shots, "page.jpg"), type="jpeg", quality=80)
            # The restorers by name; CodeFormer's fidelity slider shows only for CodeFormer.
            options = page.locator("#model-select option").all_inner_texts()
            if not any(o.startswith("codeformer") for o in options):
                problems.append(f"codeformer is not offered: {options}")
            if page.locator("#fidelity-field").is_visible():
                problems.append("the fidelity slider shows for a model without a fidelity input")
            page.select_option("#model-select", "codeformer")
            if not page.locator("#fidelity-field").is_visible():
                problems.append("no fidelity slider for codeformer")
            elif page.locator("#fidelity").input_value() != "0.5":
                problems.append("codeformer's slider does not start at its default 0.5")
            page.locator("#fidelity").fill("0")
            page.screenshot(path=os.path.join(a.shots, "fidelity.jpg"), type="jpeg", quality=80)
            faithful = os.path.join(work, "faithful", "portrait.jpg")
            os.makedirs(os.path.dirname(faithful))
            shutil.copy(photo, faithful)
            page.set_input_files("input[type=file]", [faithful])
            until(lambda: page.locator(".item a[download]").count() == 3, 120, "the codeformer photo's link")
            with page.expect_download() as d:
                page.locator(".item").first.locator("a[download]").click()
            got_faithful = os.path.join(work, "got-faithful.jpg")
            d.value.save_as(got_faithful)
            phone = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2)
            pp = phone.new_page()
            pp.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            pp.goto(url)
            pp.wait_for_selector("#mask option", state="attached")
            pp.screenshot(path=os.path.join(a.shots, "phone.jpg"), type="jpeg", quality=80)
            browser.close()

        with open(got["portrait.jpg"], "rb") as f, open(want_photo, "rb") as g:
            if f.read() != g.read():
                problems.append("the photo downloaded differs from gpen-video IN OUT's")
        with open(got_faithful, "rb") as f, open(want_faithful, "rb") as g:
            if f.read() != g.read():
                problems.append("codeformer at fidelity 0 from the page differs from the CLI's")
        n, m = frames(got["clip.mp4"]), frames(clip)
        if n != m:
            problems.append(f"the clip downloaded has {n} frames, the source {m}")
        if problems:
            sys.exit("browser-test: FAILED:\n  " + "\n  ".join(problems))
        print(f"browser-test: ok: photo equal to the CLI's, clip of {n} frames, no console error; "
              f"screenshots in {a.shots}")
    finally:
        serve_child.stop(server)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
