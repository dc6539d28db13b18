/* How fast memory serves the read patterns of the int4 / int8 group kernels, with no
 * arithmetic: 1 GiB split over the threads as tile groups (NT tiles of TILE bytes each, the
 * layout of a packed weight), read 64 bytes at a time
 *   tiles:  block b of each of the NT tiles in turn (what the 1- to 3-row kernels load),
 *           each tile's stream prefetched PF bytes ahead;
 *   sweep:  the same loads, prefetching the next NT tiles one line per tile and block step,
 *           in address order (SPECSERVE_SWEEP_PREFETCH, the kernels' default);
 *   linear: the same bytes in address order, prefetched PF bytes ahead (one stream).
 * The patterns alternate; each line is the median (and best) GB/s of the rounds.
 *
 *   gcc -O2 -mavx2 -fopenmp benchmarks/read_streams.c -o /tmp/read_streams
 *   OMP_NUM_THREADS=2 /tmp/read_streams [NT TILE_BYTES [ROUNDS]]     # default 4 12288 9
 *
 * Run it alone on the machine: it measures memory bandwidth. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { TILES, SWEEP, LINEAR, NPATTERNS };
static const char* kNames[NPATTERNS] = {"tiles", "sweep", "linear"};
static const size_t kBytes = (size_t)1 << 30;
static const size_t kPf = 1024;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static double run(const uint8_t* buf, int pattern, int nt, size_t tile) {
  const double t0 = now();
  long long sink = 0;
#pragma omp parallel reduction(+ : sink)
  {
    const size_t ngroups = kBytes / (tile * nt);
    const int th = omp_get_thread_num(), nth = omp_get_num_threads();
    const size_t g0 = ngroups * th / nth, g1 = ngroups * (th + 1) / nth;
    __m256i acc = _mm256_setzero_si256();
    for (size_t g = g0; g < g1; ++g) {
      const uint8_t* base = buf + g * nt * tile;
      const uint8_t* ahead = base + nt * tile;  /* the next group */
      const int sweep = pattern == SWEEP && g + 1 < g1;
      for (size_t b = 0; b < tile; b += 64) {
        for (int t = 0; t < nt; ++t) {
          const uint8_t* q = pattern == LINEAR ? base + (b / 64 * nt + t) * 64 : base + t * tile + b;
          if (pattern != SWEEP) _mm_prefetch((const char*)q + kPf, _MM_HINT_T0);
          if (sweep) {
            _mm_prefetch((const char*)ahead, _MM_HINT_T0);
            ahead += 64;
          }
          acc = _mm256_xor_si256(acc, _mm256_load_si256((const __m256i*)q));
          acc = _mm256_xor_si256(acc, _mm256_load_si256((const __m256i*)(q + 32)));
        }
      }
    }
    sink += _mm256_extract_epi64(acc, 0);
  }
  if (sink == 42) printf(" ");
  return kBytes / (now() - t0) / 1e9;
}

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  const int nt = argc > 1 ? atoi(argv[1]) : 4;
  const size_t tile = argc > 2 ? (size_t)atol(argv[2]) : 12288;
  const int rounds = argc > 3 ? atoi(argv[3]) : 9;
  if (nt < 1 || tile < 64 || tile % 64 || rounds < 1 || rounds > 99) {
    fprintf(stderr, "usage: read_streams [NT>=1 TILE_BYTES(multiple of 64) [ROUNDS 1-99]]\n");
    return 2;
  }
  uint8_t* buf = aligned_alloc(64, kBytes);
  if (!buf) return 1;
  for (size_t i = 0; i < kBytes; ++i) buf[i] = (uint8_t)i;
  double gbs[NPATTERNS][99];
  for (int r = 0; r < rounds; ++r)
    for (int p = 0; p < NPATTERNS; ++p) gbs[p][r] = run(buf, p, nt, tile);
  printf("threads %d, %d tiles of %zu bytes, %d rounds\n", omp_get_max_threads(), nt, tile, rounds);
  for (int p = 0; p < NPATTERNS; ++p) {
    qsort(gbs[p], rounds, sizeof(double), cmp);
    printf("%-6s median %5.1f GB/s  best %5.1f\n", kNames[p], gbs[p][rounds / 2], gbs[p][rounds - 1]);
  }
  free(buf);
  return 0;
}
