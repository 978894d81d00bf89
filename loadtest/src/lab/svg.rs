//! Line charts as inline SVG text: axes (linear or log10) with ticks, lines, a legend.
//!
//! Owns drawing only: the report decides what the lines are. No external assets, no
//! scripts: the output is a self-contained `<svg>` element.

use std::fmt::Write as _;

/// Chart size and margins, px.
const W: f64 = 760.0;
const H: f64 = 380.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 40.0;
/// Above the plot: the title, then the legend's rows.
const TITLE: f64 = 26.0;
const LEGEND_ROW: f64 = 16.0;
const BOTTOM: f64 = 46.0;

/// Colours of the runs, in order.
pub const COLOURS: [&str; 6] = [
    "#1f5fa8", "#c8372d", "#2b8a3e", "#7b4ab0", "#d97706", "#5c4033",
];

/// How an axis maps values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Proportional.
    Linear,
    /// Proportional to log10 (values must be > 0).
    Log,
}

/// One axis: its range, scale, ticks and label.
#[derive(Debug, Clone)]
pub struct Axis {
    /// What it shows.
    pub label: String,
    /// Linear or log10.
    pub scale: Scale,
    /// Shown range.
    pub min: f64,
    /// Shown range.
    pub max: f64,
    /// Tick positions and their labels.
    pub ticks: Vec<(f64, String)>,
}

impl Axis {
    /// A linear axis from `min` to about `max`, with round ticks labelled by `fmt`.
    pub fn linear(label: &str, min: f64, max: f64, fmt: fn(f64) -> String) -> Axis {
        let max = if max > min { max } else { min + 1.0 };
        let raw = (max - min) / 5.0;
        let mag = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 2.5, 5.0, 10.0]
            .iter()
            .map(|m| m * mag)
            .find(|s| *s >= raw)
            .unwrap_or(10.0 * mag);
        let top = (max / step).ceil() * step;
        let mut ticks = Vec::new();
        let mut v = (min / step).ceil() * step;
        while v <= top + step * 1e-9 {
            ticks.push((v, fmt(v)));
            v += step;
        }
        Axis {
            label: label.to_string(),
            scale: Scale::Linear,
            min,
            max: top,
            ticks,
        }
    }

    /// A log10 axis over whole decades around `min..max` (both > 0).
    pub fn log(label: &str, min: f64, max: f64, fmt: fn(f64) -> String) -> Axis {
        let lo = min.max(1e-9).log10().floor() as i32;
        let hi = (max.max(min * 10.0).log10().ceil() as i32).max(lo + 1);
        let ticks = (lo..=hi)
            .map(|e| {
                let v = 10f64.powi(e);
                (v, fmt(v))
            })
            .collect();
        Axis {
            label: label.to_string(),
            scale: Scale::Log,
            min: 10f64.powi(lo),
            max: 10f64.powi(hi),
            ticks,
        }
    }

    /// Where `v` falls, 0 (min) to 1 (max).
    fn frac(&self, v: f64) -> f64 {
        let f = match self.scale {
            Scale::Linear => (v - self.min) / (self.max - self.min),
            Scale::Log => {
                (v.max(self.min).log10() - self.min.log10()) / (self.max.log10() - self.min.log10())
            }
        };
        if f.is_finite() {
            f.clamp(0.0, 1.0)
        } else {
            0.0
        }
    }
}

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Line {
    /// Its legend entry.
    pub name: String,
    /// Stroke colour.
    pub colour: &'static str,
    /// Stroke dash pattern (`None`: solid).
    pub dash: Option<&'static str>,
    /// Points in data units.
    pub points: Vec<(f64, f64)>,
}

/// A line chart.
#[derive(Debug, Clone)]
pub struct Chart {
    /// Heading inside the picture.
    pub title: String,
    /// Horizontal axis.
    pub x: Axis,
    /// Vertical axis.
    pub y: Axis,
    /// The lines, drawn in order.
    pub lines: Vec<Line>,
}

impl Chart {
    /// The `<svg>` element.
    pub fn svg(&self) -> String {
        // Legend entries laid out first: rows under the title, as many as they need.
        let mut legend = Vec::new();
        let (mut lx, mut row) = (LEFT, 0usize);
        for l in &self.lines {
            let w = 36.0 + 6.5 * l.name.chars().count() as f64;
            if lx + w > W - RIGHT && lx > LEFT {
                (lx, row) = (LEFT, row + 1);
            }
            legend.push((lx, TITLE + 6.0 + LEGEND_ROW * row as f64));
            lx += w;
        }
        let top = TITLE + 10.0 + LEGEND_ROW * (row + 1) as f64;
        let h = H + LEGEND_ROW * row as f64;
        let (pw, ph) = (W - LEFT - RIGHT, h - top - BOTTOM);
        let px = |v: f64| LEFT + self.x.frac(v) * pw;
        let py = |v: f64| top + (1.0 - self.y.frac(v)) * ph;
        let mut s = String::new();
        let _ = write!(
            s,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {W} {h}\" width=\"{W}\" \
             height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\" role=\"img\">\
             <title>{}</title><rect width=\"{W}\" height=\"{h}\" fill=\"#fff\"/>",
            esc(&self.title)
        );
        let _ = write!(
            s,
            "<text x=\"{LEFT}\" y=\"18\" font-size=\"14\" font-weight=\"bold\">{}</text>",
            esc(&self.title)
        );
        for (v, label) in &self.y.ticks {
            let y = py(*v);
            let _ = write!(
                s,
                "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                LEFT + pw,
                LEFT - 6.0,
                y + 4.0,
                esc(label)
            );
        }
        for (v, label) in &self.x.ticks {
            let x = px(*v);
            let _ = write!(
                s,
                "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{top}\" y2=\"{:.1}\" stroke=\"#eee\"/>\
                 <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                top + ph,
                top + ph + 16.0,
                esc(label)
            );
        }
        let _ = write!(
            s,
            "<rect x=\"{LEFT}\" y=\"{top}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" \
             stroke=\"#888\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\
             <text transform=\"translate(14 {:.1}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
            LEFT + pw / 2.0,
            h - 8.0,
            esc(&self.x.label),
            top + ph / 2.0,
            esc(&self.y.label)
        );
        for l in &self.lines {
            if l.points.is_empty() {
                continue;
            }
            let pts: Vec<String> = l
                .points
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                .collect();
            let dash = l
                .dash
                .map(|d| format!(" stroke-dasharray=\"{d}\""))
                .unwrap_or_default();
            let _ = write!(
                s,
                "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\"{dash} \
                 points=\"{}\"><title>{}</title></polyline>",
                l.colour,
                pts.join(" "),
                esc(&l.name)
            );
        }
        for (l, (x, y)) in self.lines.iter().zip(legend) {
            let dash = l
                .dash
                .map(|d| format!(" stroke-dasharray=\"{d}\""))
                .unwrap_or_default();
            let _ = write!(
                s,
                "<line x1=\"{x:.1}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"{}\" \
                 stroke-width=\"2\"{dash}/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                x + 22.0,
                l.colour,
                x + 26.0,
                y + 4.0,
                esc(&l.name)
            );
        }
        s.push_str("</svg>");
        s
    }
}

/// µs as a short label: `250 µs`, `1.5 ms`, `2 s`.
pub fn fmt_us(v: f64) -> String {
    if v >= 1e6 {
        format!("{} s", trim(v / 1e6))
    } else if v >= 1e3 {
        format!("{} ms", trim(v / 1e3))
    } else {
        format!("{} µs", trim(v))
    }
}

/// A plain number without needless decimals.
pub fn fmt_num(v: f64) -> String {
    if v.abs() >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if v.abs() >= 1e4 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Text for HTML and SVG.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_and_labels() {
        let a = Axis::linear("x", 0.0, 93.0, fmt_num);
        assert_eq!(a.max, 100.0);
        assert_eq!(a.ticks.first().map(|t| t.1.as_str()), Some("0"));
        let l = Axis::log("y", 80.0, 12_000.0, fmt_us);
        assert_eq!((l.min, l.max), (10.0, 100_000.0));
        assert_eq!(l.ticks[2].1, "1 ms");
        assert_eq!(fmt_us(250.0), "250 µs");
        assert_eq!(fmt_us(1500.0), "1.5 ms");
        assert_eq!(esc("a<b&\"c\""), "a&lt;b&amp;&quot;c&quot;");
        let c = Chart {
            title: "t".into(),
            x: a,
            y: l,
            lines: vec![Line {
                name: "run <1>".into(),
                colour: COLOURS[0],
                dash: None,
                points: vec![(0.0, 100.0), (50.0, 1000.0)],
            }],
        };
        let svg = c.svg();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("<polyline") && svg.contains("run &lt;1&gt;"));
    }
}
