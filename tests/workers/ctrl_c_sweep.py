"""A real SIGINT (a kernel timer, POSIX timer_create) at a different moment of each selected
step: from the region's last lines through its exit and torch's stop to after it. Prints what
the loop caught and what was recorded, as JSON.

Usage: python ctrl_c_sweep.py SAVE_PATH STEPS SPAN_US discrete|fused
"""

import ctypes
import json
import signal
import sys
import threading

import torch
from torch.autograd import profiler as autograd_profiler

import torchstep_prof as tsp

_libc = ctypes.CDLL(None, use_errno=True)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class _Sigevent(ctypes.Structure):  # Linux's struct sigevent: 64 bytes
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int), ("_pad", ctypes.c_byte * 48)]


CLOCK_MONOTONIC, SIGEV_THREAD_ID = 1, 4
# Sent to the main thread itself: sent to the process, the kernel may hand it to another thread
# (torch's, the writer's) whose handler runs only when that thread is next scheduled, after the
# loop below has moved on, and the Ctrl-C then lands in the next step's first line instead.
_event = _Sigevent(None, signal.SIGINT, SIGEV_THREAD_ID)
ctypes.c_int.from_buffer(_event._pad).value = threading.get_native_id()  # sigev_notify_thread_id
_timer = ctypes.c_void_p()
if _libc.timer_create(CLOCK_MONOTONIC, ctypes.byref(_event), ctypes.byref(_timer)):
    raise OSError(ctypes.get_errno(), "timer_create")


def sigint_after(seconds: float) -> None:
    ns = max(1, int(seconds * 1e9))
    spec = _Itimerspec(_Timespec(0, 0), _Timespec(ns // 10**9, ns % 10**9))
    if _libc.timer_settime(_timer, 0, ctypes.byref(spec), None):
        raise OSError(ctypes.get_errno(), "timer_settime")


def armed() -> bool:
    spec = _Itimerspec()
    _libc.timer_gettime(_timer, ctypes.byref(spec))
    return bool(spec.it_value.tv_sec or spec.it_value.tv_nsec)


save_path, count, span_us, mode = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
steps = list(range(1, count + 1))
caught = []
with tsp.configure(save_path=save_path, summary=False, discrete=mode == "discrete"), tsp.schedule(steps=steps):
    for n in steps:
        try:
            with tsp.step(n), tsp.profile_region("actor", "update"):
                x = torch.ones(4).add(1)
                sigint_after(span_us * 1e-6 * (n % 97) / 96)  # 0 .. SPAN_US, a new moment each step
            while armed():  # not interrupted yet: it lands here, not in the next step
                pass
        except KeyboardInterrupt:
            caught.append(n)
    tsp.flush()
print(json.dumps({
    "caught": caught,
    "enabled": autograd_profiler._is_profiler_enabled,
    "records": [[r.step, r.ok, r.error] for r in tsp.records().traces],
}))
