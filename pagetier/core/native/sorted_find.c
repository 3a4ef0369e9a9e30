/* Sorted lookups for pagetier.core.sorted_find, loaded with ctypes (no Python headers).
 *
 * find_<type>(hay, n, x, m, pos, found): for each x[i], pos[i] is np.searchsorted(hay, x[i])
 * (side "left": the first place whose element is not below x[i]) and found[i] whether
 * hay[pos[i]] == x[i]. hay is sorted (non-decreasing). x in any order, but when it is sorted
 * each search starts at the last one's place: it counts the elements below x[i] when they lie
 * within SCAN of it (no branch an element), else gallops forward (1, 2, 4, ... elements, then
 * a binary search of the last step): a merge-join costing O(log gap) a key, not O(log n).
 *
 * member_<type>(hay, n, x, m, found): found[] alone, as find_<type> gives it. With at least as
 * many needles as hay (the rules' "which accessed units are in the last hot set": about two
 * needles an element) the next element is usually within a step or two: each search steps
 * through up to STEP elements one by one before it gallops, instead of counting SCAN of them.
 * common_<type>(hay, n, x, m): how many of x are in hay (the count of member's found).
 *
 * union_i64: the merge of two sorted index arrays (pagetier.core.state.union).
 */
#include <stdint.h>

#define SCAN 16 /* elements a search counts through before it gallops */

#define DEFINE_FIND(name, type)                                                        \
	void name(const type *hay, int64_t n, const type *x, int64_t m, int64_t *pos,      \
		  uint8_t *found)                                                          \
	{                                                                                  \
		int64_t lo = 0;                                                            \
		for (int64_t i = 0; i < m; i++) {                                          \
			type v = x[i];                                                     \
			int64_t hi;                                                        \
			if (i && v < x[i - 1]) {                                           \
				hi = lo; /* out of order: search everything before */      \
				lo = 0;                                                    \
			} else if (lo + SCAN <= n && hay[lo + SCAN - 1] >= v) {            \
				/* within SCAN elements: count those below v, no branch */ \
				int64_t below = 0;                                         \
				for (int j = 0; j < SCAN; j++)                             \
					below += hay[lo + j] < v;                          \
				lo += below;                                               \
				hi = lo;                                                   \
			} else {                                                           \
				/* gallop: hay[lo - 1] < v; find hi with hay[hi] >= v */   \
				int64_t step = 1;                                          \
				hi = lo;                                                   \
				while (hi < n && hay[hi] < v) {                            \
					lo = hi + 1;                                       \
					hi += step;                                        \
					step <<= 1;                                        \
				}                                                          \
				if (hi > n)                                                \
					hi = n;                                            \
			}                                                                  \
			/* binary search of [lo, hi): the first element not below v */     \
			while (lo < hi) {                                                  \
				int64_t mid = lo + ((hi - lo) >> 1);                       \
				if (hay[mid] < v)                                          \
					lo = mid + 1;                                      \
				else                                                       \
					hi = mid;                                          \
			}                                                                  \
			pos[i] = lo;                                                       \
			found[i] = lo < n && hay[lo] == v;                                 \
		}                                                                          \
	}

DEFINE_FIND(find_u64, uint64_t)
DEFINE_FIND(find_i64, int64_t)

#define STEP 8 /* elements a dense search steps through before it gallops */

/* The first place lo' >= lo whose element is not below v, for v not below the last needle
 * (hay[lo - 1] < v): one by one up to STEP elements (dense) or counting SCAN (sparse), then
 * galloping and a binary search. */
#define DEFINE_NEXT(name, type)                                                        \
	static inline int64_t name(const type *hay, int64_t n, int64_t lo, type v,        \
				   int dense)                                               \
	{                                                                                  \
		int64_t hi;                                                                \
		if (dense) {                                                               \
			int64_t end = lo + STEP < n ? lo + STEP : n;                       \
			while (lo < end && hay[lo] < v)                                    \
				lo++;                                                      \
			if (lo < end || lo >= n || hay[lo] >= v)                           \
				return lo;                                                 \
		} else if (lo + SCAN <= n && hay[lo + SCAN - 1] >= v) {                    \
			int64_t below = 0;                                                 \
			for (int j = 0; j < SCAN; j++)                                     \
				below += hay[lo + j] < v;                                  \
			return lo + below;                                                 \
		}                                                                          \
		int64_t step = 1;                                                          \
		hi = lo;                                                                   \
		while (hi < n && hay[hi] < v) {                                            \
			lo = hi + 1;                                                       \
			hi += step;                                                        \
			step <<= 1;                                                        \
		}                                                                          \
		if (hi > n)                                                                \
			hi = n;                                                            \
		while (lo < hi) {                                                          \
			int64_t mid = lo + ((hi - lo) >> 1);                               \
			if (hay[mid] < v)                                                  \
				lo = mid + 1;                                              \
			else                                                               \
				hi = mid;                                                  \
		}                                                                          \
		return lo;                                                                 \
	}

/* for x out of order at i: a binary search of hay[0, lo) */
#define DEFINE_BEFORE(name, type)                                                      \
	static inline int64_t name(const type *hay, int64_t hi, type v)                   \
	{                                                                                  \
		int64_t lo = 0;                                                            \
		while (lo < hi) {                                                          \
			int64_t mid = lo + ((hi - lo) >> 1);                               \
			if (hay[mid] < v)                                                  \
				lo = mid + 1;                                              \
			else                                                               \
				hi = mid;                                                  \
		}                                                                          \
		return lo;                                                                 \
	}

#define DEFINE_MEMBER(suffix, type)                                                    \
	DEFINE_NEXT(next_##suffix, type)                                               \
	DEFINE_BEFORE(before_##suffix, type)                                           \
	void member_##suffix(const type *hay, int64_t n, const type *x, int64_t m,        \
			     uint8_t *found)                                              \
	{                                                                                  \
		int64_t lo = 0;                                                            \
		int dense = m >= n;                                                        \
		for (int64_t i = 0; i < m; i++) {                                          \
			type v = x[i];                                                     \
			if (i && v < x[i - 1])                                             \
				lo = before_##suffix(hay, lo, v);                          \
			else                                                               \
				lo = next_##suffix(hay, n, lo, v, dense);                  \
			found[i] = lo < n && hay[lo] == v;                                 \
		}                                                                          \
	}                                                                                  \
	int64_t common_##suffix(const type *hay, int64_t n, const type *x, int64_t m)     \
	{                                                                                  \
		int64_t lo = 0, k = 0;                                                     \
		int dense = m >= n;                                                        \
		for (int64_t i = 0; i < m; i++) {                                          \
			type v = x[i];                                                     \
			if (i && v < x[i - 1])                                             \
				lo = before_##suffix(hay, lo, v);                          \
			else                                                               \
				lo = next_##suffix(hay, n, lo, v, dense);                  \
			k += lo < n && hay[lo] == v;                                       \
		}                                                                          \
		return k;                                                                  \
	}

DEFINE_MEMBER(u64, uint64_t)
DEFINE_MEMBER(i64, int64_t)

/* union_i64(a, n, b, m, out): the sorted distinct elements of sorted a and b merged into out
 * (room for n + m); returns how many. */
int64_t union_i64(const int64_t *a, int64_t n, const int64_t *b, int64_t m, int64_t *out)
{
	int64_t i = 0, j = 0, k = 0;
	while (i < n || j < m) {
		int64_t v;
		if (j >= m || (i < n && a[i] <= b[j]))
			v = a[i++];
		else
			v = b[j++];
		if (!k || out[k - 1] != v)
			out[k++] = v;
	}
	return k;
}

/* The keys of pagetier.policies.rules.arrays.argsort_desc, whose sort ranks non-negative
 * float64 values largest first, ties in index order.
 *
 * rank_keys(x, n, b, key): key[i] = ~bits(x[i] + 0.0) with its low b bits replaced by i;
 * returns 1 (key unfinished) when a value is negative or NaN, else 0.
 * rank_order(key, n, b, x, order): order[i] = key[i]'s low b bits (the sorted keys' indices);
 * returns how many adjacent pairs tie in the key's high bits but not in full value (to be put
 * in order by the caller). */
#include <string.h>

int rank_keys(const double *x, int64_t n, int b, uint64_t *key)
{
	uint64_t low = (b >= 64) ? ~0ULL : ((1ULL << b) - 1);
	for (int64_t i = 0; i < n; i++) {
		double v = x[i] + 0.0; /* -0.0 made +0.0 */
		uint64_t bits;
		if (!(v >= 0))
			return 1;
		memcpy(&bits, &v, sizeof bits);
		key[i] = (~bits & ~low) | (uint64_t)i;
	}
	return 0;
}

int64_t rank_order(const uint64_t *key, int64_t n, int b, const double *x, int64_t *order)
{
	uint64_t low = (b >= 64) ? ~0ULL : ((1ULL << b) - 1);
	int64_t bad = 0;
	uint64_t prev_full = 0;
	for (int64_t i = 0; i < n; i++) {
		int64_t k = (int64_t)(key[i] & low);
		double v = x[k] + 0.0;
		uint64_t full;
		memcpy(&full, &v, sizeof full);
		order[i] = k;
		if (i && (key[i] >> b) == (key[i - 1] >> b) && full != prev_full)
			bad++;
		prev_full = full;
	}
	return bad;
}

/* spread(out, was, got, added, k, total, size): the merge of a column after a union
 * (pagetier.core.state.union_remap): out (total elements of size bytes) gets got's k elements
 * at the places added (strictly increasing) and was's total - k elements, in order, at the
 * others: one copy a run. */
void spread(char *out, const char *was, const char *got, const int64_t *added, int64_t k,
	    int64_t total, int64_t size)
{
	int64_t src = 0, dst = 0;
	for (int64_t j = 0; j < k; j++) {
		int64_t run = added[j] - dst;
		memcpy(out + dst * size, was + src * size, (size_t)(run * size));
		src += run;
		memcpy(out + added[j] * size, got + j * size, (size_t)size);
		dst = added[j] + 1;
	}
	memcpy(out + dst * size, was + src * size, (size_t)((total - dst) * size));
}

/* insert_shift(at, k, n, remap): where each of n sorted elements goes when k elements are
 * inserted before the places at (sorted, each in [0, n]): remap[i] = i + #{j: at[j] <= i}
 * (pagetier.core.state.union_remap). */
void insert_shift(const int64_t *at, int64_t k, int64_t n, int64_t *remap)
{
	int64_t j = 0;
	for (int64_t i = 0; i < n; i++) {
		while (j < k && at[j] <= i)
			j++;
		remap[i] = i + j;
	}
}

/* scale_fast(score, cand, fast, m, out): out[i] = score[cand[i]] * (1.0 + 1e-9 * fast[cand[i]])
 * as numpy computes it (pagetier.policies.rules.noise.hot_order's tie-break to fast units). */
void scale_fast(const double *score, const int64_t *cand, const uint8_t *fast, int64_t m,
		double *out)
{
	const double up = 1.0 + 1e-9 * 1.0, same = 1.0 + 1e-9 * 0.0;
	for (int64_t i = 0; i < m; i++) {
		int64_t c = cand[i];
		out[i] = score[c] * (fast[c] ? up : same);
	}
}

/* sort_u64(a, n, tmp): a sorted in place, ascending: an LSD radix sort of 11-bit digits (6
 * passes) with tmp (n elements, n < 2^32) as scratch. The digits' counts are taken in one pass;
 * a digit that every key shares moves nothing and is skipped (the high bits of the ranking's
 * keys, made of floats' exponents, mostly are). numpy's sort of 30,000-60,000 keys costs 2.5-3
 * times as much on the daemon's host (no SIMD sort). */
#define RADIX_BITS 11
#define RADIX_SIZE (1 << RADIX_BITS)
#define RADIX_MASK (RADIX_SIZE - 1)

#define DEFINE_RADIX(name, type, digits)                                                   \
	static void name(type *a, int64_t n, type *tmp)                                    \
	{                                                                                  \
		uint32_t count[digits][RADIX_SIZE];                                        \
		type *src = a, *dst = tmp;                                                 \
		if (n < 2)                                                                 \
			return;                                                            \
		memset(count, 0, sizeof count);                                            \
		for (int64_t i = 0; i < n; i++) {                                          \
			type k = a[i];                                                     \
			for (int d = 0; d < digits; d++)                                   \
				count[d][(k >> (RADIX_BITS * d)) & RADIX_MASK]++;          \
		}                                                                          \
		for (int d = 0; d < digits; d++) {                                         \
			uint32_t *c = count[d], sum = 0;                                   \
			if (c[(src[0] >> (RADIX_BITS * d)) & RADIX_MASK] == (uint32_t)n)   \
				continue;                                                  \
			for (int v = 0; v < RADIX_SIZE; v++) {                             \
				uint32_t t = c[v];                                         \
				c[v] = sum;                                                \
				sum += t;                                                  \
			}                                                                  \
			for (int64_t i = 0; i < n; i++) {                                  \
				type k = src[i];                                           \
				dst[c[(k >> (RADIX_BITS * d)) & RADIX_MASK]++] = k;        \
			}                                                                  \
			type *t = src;                                                     \
			src = dst;                                                         \
			dst = t;                                                           \
		}                                                                          \
		if (src != a)                                                              \
			memcpy(a, src, (size_t)n * sizeof *a);                             \
	}

DEFINE_RADIX(radix_u64, uint64_t, 6)
DEFINE_RADIX(radix_u32, uint32_t, 3)

void sort_u64(uint64_t *a, int64_t n, uint64_t *tmp)
{
	radix_u64(a, n, tmp);
}

/* sort_f32(a, n, tmp): float32 a sorted in place, ascending, as sort_u64 does (3 digits of
 * their bit patterns, which order as the values for non-negative floats); returns 1, a left
 * as it was, when a value has its sign bit set or is NaN (the caller sorts those), else 0
 * (n < 2: nothing to sort, 0). */
int sort_f32(float *a, int64_t n, uint32_t *tmp)
{
	const uint32_t *bits = (const uint32_t *)a;
	for (int64_t i = 0; i < n; i++)
		if ((bits[i] & 0x80000000u) || (bits[i] & 0x7fffffffu) > 0x7f800000u)
			return 1; /* negative, -0.0 or NaN */
	radix_u32((uint32_t *)a, n, tmp);
	return 0;
}

/* compress(keep, n, k, cols, outs, sizes): for each of k columns of n elements (cols[j], of
 * sizes[j] bytes an element: 1, 2, 4 or 8), outs[j] gets the elements where keep is set, in
 * order: numpy's col[keep] for every column. Without a branch an element: each is written at
 * the next place and the place advances when it is kept, so outs[j] needs room for one more
 * element than are kept. Returns how many are kept, or -1 for another size (nothing done). */
#define COMPRESS_COL(type)                                                                 \
	do {                                                                               \
		const type *c = (const type *)cols[j];                                     \
		type *o = (type *)outs[j];                                                 \
		m = 0;                                                                     \
		for (int64_t i = 0; i < n; i++) {                                          \
			o[m] = c[i];                                                       \
			m += keep[i] != 0;                                                 \
		}                                                                          \
	} while (0)

int64_t compress(const uint8_t *keep, int64_t n, int64_t k, char *const *cols, char *const *outs,
		 const int64_t *sizes)
{
	int64_t m = 0;
	for (int64_t j = 0; j < k; j++)
		if (sizes[j] != 1 && sizes[j] != 2 && sizes[j] != 4 && sizes[j] != 8)
			return -1;
	if (!k)
		for (int64_t i = 0; i < n; i++)
			m += keep[i] != 0;
	for (int64_t j = 0; j < k; j++) {
		switch (sizes[j]) {
		case 1: COMPRESS_COL(uint8_t); break;
		case 2: COMPRESS_COL(uint16_t); break;
		case 4: COMPRESS_COL(uint32_t); break;
		default: COMPRESS_COL(uint64_t); break;
		}
	}
	return m;
}
