// Force-included for mlx-c (g++) and for bindgen (clang) on x86_64. mlx-c's half.h only
// declares float16_t/bfloat16_t on aarch64, yet mlx-rs calls the f16/bf16 accessors
// unconditionally. The accessors only move raw 16-bit values, so a 16-bit storage type is
// all that is needed here.
#pragma once
#if !defined(__aarch64__)
#include <stdint.h>
#define HAS_FLOAT16
#define HAS_BFLOAT16
#if defined(__clang__) && !defined(__cplusplus)
typedef __fp16 float16_t;
#else
typedef uint16_t float16_t;
#endif
typedef uint16_t bfloat16_t;
#endif
