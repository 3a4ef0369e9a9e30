/* PageState's per-row passes for pagetier.core.row_merge, loaded with ctypes (no Python
 * headers). The rows are PageState's 36-byte records (pagetier/core/state.py: DTYPE); the
 * caller passes each field's byte offset in `off` (OFF_* below), so the layout lives in one
 * place. Each function does in one pass over a read's or the candidates' rows what numpy does
 * in a gather, a pass per field and a scatter.
 *
 * Arithmetic is float32 as numpy's on the same fields (no -ffast-math): the same bits.
 */
#include <stdint.h>
#include <string.h>

enum {
	OFF_HEAT, OFF_RATE, OFF_COUNT, OFF_LAST_ACCESS, OFF_NPAGES, OFF_NODE, OFF_FLAGS,
	OFF_LAST_MOVE, OFF_ADDR, OFF_TARGET, NOFF
};

#define F_CAND 8
#define F_REGION 16

#define FIELD(rows, stride, i, off, type) ((type *)((rows) + (i) * (stride) + (off)))

/* Rows are read in index order but far apart (tens of thousands among hundreds of thousands,
 * a state of tens of MiB): each is fetched AHEAD rows before it is used, so that the misses
 * overlap instead of following one another. */
#define AHEAD 16
#define PREFETCH_ROW(rows, stride, j) __builtin_prefetch((rows) + (j) * (stride), 1)
#define SCAN 16 /* keys a lookup counts through before it gallops */

/* v's place among keys[lo..n) (keys[lo - 1] < v): np.searchsorted(keys, v). The
 * read's keys come sorted and most are the next row's (a run of accessed units) or a few rows
 * on (units between them not accessed): the next row is looked at first, then SCAN rows are
 * counted without a branch a key, and only past them does the search gallop. */
static inline int64_t find_key(const uint64_t *keys, int64_t n, uint64_t v, int64_t lo)
{
	if (lo >= n || keys[lo] >= v)
		return lo;
	lo++; /* keys[lo - 1] < v */
	if (lo + SCAN <= n && keys[lo + SCAN - 1] >= v) {
		int64_t below = 0;
		for (int j = 0; j < SCAN - 1; j++)
			below += keys[lo + j] < v;
		return lo + below;
	}
	if (lo + SCAN <= n)
		lo += SCAN;
	int64_t step = 1, hi = lo;
	while (hi < n && keys[hi] < v) { /* gallop: keys[lo - 1] < v */
		lo = hi + 1;
		hi += step;
		step <<= 1;
	}
	if (hi > n)
		hi = n;
	while (lo < hi) {
		int64_t mid = lo + ((hi - lo) >> 1);
		if (keys[mid] < v)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Whether found row j differs from the read's node, npages and (region not NULL) region flag. */
static inline int row_changed(const uint8_t *rows, int64_t stride, const int64_t *off, int64_t j,
			      int16_t node, uint16_t npages, const uint8_t *region, int64_t i)
{
	int ch = *FIELD(rows, stride, j, off[OFF_NODE], int8_t) != node ||
		 *FIELD(rows, stride, j, off[OFF_NPAGES], uint16_t) != npages;
	if (region)
		ch |= ((*FIELD(rows, stride, j, off[OFF_FLAGS], uint8_t) & F_REGION) != 0) !=
		      (region[i] != 0);
	return ch;
}

/* One row takes one unit's accesses, as add_accesses below describes; *rated grows by 1 when
 * its rate went above 0 (and falls by 1 when it went from above 0 to 0 or under). */
static inline void add_row(uint8_t *rows, int64_t stride, const int64_t *off, int64_t j,
			   uint32_t count, float rate, float scale, int32_t interval, int32_t cand,
			   float *before, uint8_t *joined, int64_t *rated)
{
	float *heat = FIELD(rows, stride, j, off[OFF_HEAT], float);
	float *r = FIELD(rows, stride, j, off[OFF_RATE], float);
	float add = rate / scale;
	int was = *r > 0;
	*FIELD(rows, stride, j, off[OFF_COUNT], uint32_t) += count;
	*r += rate;
	*rated += (int64_t)(*r > 0) - was;
	*before = *heat;
	*heat = *heat + add;
	*FIELD(rows, stride, j, off[OFF_LAST_ACCESS], int32_t) = interval;
	if (cand) {
		uint8_t *flags = FIELD(rows, stride, j, off[OFF_FLAGS], uint8_t);
		*joined = (*flags & F_CAND) == 0;
		*flags |= F_CAND;
	}
}

/* The accesses a lookup adds (lookup_add), NULL for none (lookup_rows). */
struct accesses {
	const uint32_t *count;
	const float *rate;
	float scale;
	int32_t interval, cand;
	int64_t *acc;
	float *before;
	uint8_t *joined;
	int64_t n; /* how many went to acc, before and joined */
	int64_t rated; /* rows with a rate above 0: how many more than before */
};

/* The walk both lookups share, one pass over the read's keys and their rows: each key's place
 * (find_key, from the last key's), its row fetched, and AHEAD keys behind, a found row compared
 * with the read's node, size and region flag and, with add, an unchanged one given its
 * accesses. Returns how many changed, or -1 (nothing written that counts: x is checked before
 * a row is written) when x is not strictly increasing. */
static inline int64_t lookup_walk(const uint64_t *keys, int64_t n, const uint64_t *x, int64_t m,
				  uint8_t *rows, int64_t stride, const int64_t *off,
				  const int16_t *node, const uint16_t *npages,
				  const uint8_t *region, int64_t *pos, uint8_t *found,
				  uint8_t *changed, struct accesses *add)
{
	int64_t nch = 0, k = 0, lo = 0;
	for (int64_t i = 1; i < m; i++)
		if (x[i] <= x[i - 1])
			return -1;
	for (int64_t t = 0; t < m + AHEAD; t++) {
		if (t < m) { /* the key AHEAD rows on: its place, its row fetched */
			uint64_t v = x[t];
			lo = find_key(keys, n, v, lo);
			pos[t] = lo;
			found[t] = lo < n && keys[lo] == v;
			if (found[t]) {
				PREFETCH_ROW(rows, stride, lo);
				lo++; /* the next key lies past this one */
			}
		}
		int64_t i = t - AHEAD;
		if (i < 0)
			continue;
		changed[i] = 0;
		if (!found[i])
			continue;
		int64_t j = pos[i];
		int ch = row_changed(rows, stride, off, j, node[i], npages[i], region, i);
		changed[i] = (uint8_t)ch;
		nch += ch;
		if (!add || ch || !(add->count[i] > 0 || add->rate[i] > 0))
			continue;
		add_row(rows, stride, off, j, add->count[i], add->rate[i], add->scale,
			add->interval, add->cand, add->before + k, add->joined + k, &add->rated);
		add->acc[k++] = j;
	}
	if (add)
		add->n = k;
	return nch;
}

/* lookup_rows(keys, n, x, m, rows, stride, off, node, npages, region, pos, found, changed):
 * for sorted unique keys[n] (the rows' keys) and strictly increasing x[m] (a read's keys):
 * pos[i] = np.searchsorted(keys, x[i]), found[i] whether keys[pos[i]] == x[i], and for a found
 * one changed[i] whether the read's node or npages (or, region not NULL, region flag) differ
 * from the row's. Each search starts from the last key's place.
 * Returns how many changed, or -1 (nothing written that counts) when x is not strictly
 * increasing: the caller takes numpy's way. */
int64_t lookup_rows(const uint64_t *keys, int64_t n, const uint64_t *x, int64_t m,
		    const uint8_t *rows, int64_t stride, const int64_t *off, const int16_t *node,
		    const uint16_t *npages, const uint8_t *region, int64_t *pos, uint8_t *found,
		    uint8_t *changed)
{
	return lookup_walk(keys, n, x, m, (uint8_t *)rows, stride, off, node, npages, region, pos,
			   found, changed, NULL);
}

/* add_accesses(rows, stride, off, idx, m, count, rate, scale, interval, cand, acc, before,
 * joined, rated): rows idx[m] (sorted unique) take a read's accesses: those with count[i] > 0 or
 * rate[i] > 0 get count += count[i], rate += rate[i], heat += rate[i] / scale (heat is
 * stored divided by the global scale), last_access = interval. Their indices go to acc, their
 * stored heat before to before; with cand set, joined[k] says whether acc[k] was outside the
 * candidate set (its F_CAND flag clear; now set); *rated grows by how many more of the rows have
 * a rate above 0 (the read-again check's count, pagetier/core/state.py). Returns how many were
 * accessed. */
int64_t add_accesses(uint8_t *rows, int64_t stride, const int64_t *off, const int64_t *idx,
		     int64_t m, const uint32_t *count, const float *rate, float scale,
		     int32_t interval, int32_t cand, int64_t *acc, float *before, uint8_t *joined,
		     int64_t *rated)
{
	int64_t k = 0;
	for (int64_t i = 0; i < m; i++) {
		if (i + AHEAD < m)
			PREFETCH_ROW(rows, stride, idx[i + AHEAD]);
		if (!(count[i] > 0 || rate[i] > 0))
			continue;
		add_row(rows, stride, off, idx[i], count[i], rate[i], scale, interval, cand,
			before + k, joined + k, rated);
		acc[k++] = idx[i];
	}
	return k;
}

/* lookup_add(keys, n, x, m, rows, stride, off, node, npages, region, count, rate, scale,
 * interval, cand, pos, found, changed, acc, before, joined, nacc, rated): lookup_rows, and in
 * the same pass over the rows add_accesses for the found units whose node, size and region
 * flag are unchanged (their accesses do not depend on the new node; the changed ones take
 * their node first, then their accesses, from the caller). *nacc: how many went to acc, before
 * and joined; *rated grows as add_accesses says. Returns how many changed, or -1 (nothing
 * written) when x is not strictly increasing. */
int64_t lookup_add(const uint64_t *keys, int64_t n, const uint64_t *x, int64_t m,
		   uint8_t *rows, int64_t stride, const int64_t *off, const int16_t *node,
		   const uint16_t *npages, const uint8_t *region, const uint32_t *count,
		   const float *rate, float scale, int32_t interval, int32_t cand, int64_t *pos,
		   uint8_t *found, uint8_t *changed, int64_t *acc, float *before, uint8_t *joined,
		   int64_t *nacc, int64_t *rated)
{
	struct accesses add = {count, rate, scale, interval, cand, acc, before, joined, 0, 0};
	int64_t nch = lookup_walk(keys, n, x, m, rows, stride, off, node, npages, region, pos,
				  found, changed, &add);
	*nacc = add.n;
	*rated += add.rated;
	return nch;
}

/* prune(rows, stride, off, cand, n, scale, floor, dropped): the candidates cand[n] whose heat
 * (stored heat times scale, as float32) fell below floor leave: cand is compacted in place,
 * their F_CAND flags cleared, their stored heats written to dropped in order. Returns how many
 * stay. */
int64_t prune(uint8_t *rows, int64_t stride, const int64_t *off, int64_t *cand, int64_t n,
	      float scale, float floor, float *dropped)
{
	int64_t k = 0, d = 0;
	for (int64_t i = 0; i < n; i++) {
		if (i + AHEAD < n)
			PREFETCH_ROW(rows, stride, cand[i + AHEAD]);
		int64_t j = cand[i];
		float h = *FIELD(rows, stride, j, off[OFF_HEAT], float);
		float p = h * scale;
		if (p >= floor) {
			cand[k++] = j;
		} else {
			dropped[d++] = h;
			*FIELD(rows, stride, j, off[OFF_FLAGS], uint8_t) &= (uint8_t)~F_CAND;
		}
	}
	return k;
}

/* columns(rows, stride, off, idx, m, scale, heat, rate, node, npages, last_move, keys): the
 * decision's columns of rows idx[m] (within bounds) in one pass: heat as the stored heat
 * times scale in float32, then widened (as numpy's (h * float32(scale)).astype(float64)),
 * rate widened, node, npages and last_move widened to int64; keys (when not NULL) the units'
 * keys, (target << 48) | (addr >> 12). */
void columns(const uint8_t *rows, int64_t stride, const int64_t *off, const int64_t *idx,
	     int64_t m, float scale, double *heat, double *rate, int8_t *node, int64_t *npages,
	     int64_t *last_move, uint64_t *keys)
{
	for (int64_t i = 0; i < m; i++) {
		if (i + AHEAD < m)
			__builtin_prefetch(rows + idx[i + AHEAD] * stride, 0);
		const uint8_t *r = rows + idx[i] * stride;
		float h = *(const float *)(r + off[OFF_HEAT]) * scale;
		heat[i] = (double)h;
		rate[i] = (double)*(const float *)(r + off[OFF_RATE]);
		node[i] = *(const int8_t *)(r + off[OFF_NODE]);
		npages[i] = *(const uint16_t *)(r + off[OFF_NPAGES]);
		last_move[i] = *(const int32_t *)(r + off[OFF_LAST_MOVE]);
		if (keys)
			keys[i] = ((uint64_t) * (const uint16_t *)(r + off[OFF_TARGET]) << 48) |
				  (*(const uint64_t *)(r + off[OFF_ADDR]) >> 12);
	}
}

/* clear_rates(rows, stride, off, idx, m): rate and count of rows idx[m] set to 0 (a new
 * interval), each row fetched AHEAD rows before. */
void clear_rates(uint8_t *rows, int64_t stride, const int64_t *off, const int64_t *idx, int64_t m)
{
	for (int64_t i = 0; i < m; i++) {
		if (i + AHEAD < m)
			PREFETCH_ROW(rows, stride, idx[i + AHEAD]);
		*FIELD(rows, stride, idx[i], off[OFF_RATE], float) = 0;
		*FIELD(rows, stride, idx[i], off[OFF_COUNT], uint32_t) = 0;
	}
}

/* count_rated(rows, stride, off, idx, m): how many of rows idx[m] have a rate above 0. */
int64_t count_rated(const uint8_t *rows, int64_t stride, const int64_t *off, const int64_t *idx,
		    int64_t m)
{
	int64_t k = 0;
	for (int64_t i = 0; i < m; i++) {
		if (i + AHEAD < m)
			__builtin_prefetch(rows + idx[i + AHEAD] * stride, 0);
		k += *FIELD(rows, stride, idx[i], off[OFF_RATE], const float) > 0;
	}
	return k;
}

/* has_flag(rows, stride, off, idx, m, flag, out): out[i] whether row idx[i] has flag set. */
void has_flag(const uint8_t *rows, int64_t stride, const int64_t *off, const int64_t *idx,
	      int64_t m, int32_t flag, uint8_t *out)
{
	for (int64_t i = 0; i < m; i++) {
		if (i + AHEAD < m)
			__builtin_prefetch(rows + idx[i + AHEAD] * stride, 0);
		out[i] = (*FIELD(rows, stride, idx[i], off[OFF_FLAGS], const uint8_t) & flag) != 0;
	}
}
