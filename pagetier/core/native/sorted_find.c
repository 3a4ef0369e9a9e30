/* Sorted lookups for pagetier.core.sorted_find, loaded with ctypes (no Python headers).
 *
 * find_<type>(hay, n, x, m, pos, found): for each x[i], pos[i] is np.searchsorted(hay, x[i])
 * (side "left": the first place whose element is not below x[i]) and found[i] whether
 * hay[pos[i]] == x[i]. hay is sorted (non-decreasing). x in any order, but when it is sorted
 * each search starts at the last one's place: it counts the elements below x[i] when they lie
 * within SCAN of it (no branch an element), else gallops forward (1, 2, 4, ... elements, then
 * a binary search of the last step): a merge-join costing O(log gap) a key, not O(log n).
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
